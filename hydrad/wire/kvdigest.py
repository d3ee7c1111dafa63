"""A short digest of the tokens a slot's KV holds, shared by the engine and the coordinator.

An engine reports it with each finished request (``DONE.kv_hash``); whoever reads the slot's state
afterwards (the coordinator keeping a session, over STATE_GET) compares it with the digest of the
state's own token list, and so knows the slot still holds that turn and not a later request's.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash


def tokens_digest(tokens: Sequence[int]) -> str:
    """xxh3-64 (hex) of the token ids as int32 little-endian."""
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - every platform CPython builds on has a 4-byte C int
        raise RuntimeError("int32 token arrays need a 4-byte C int")
    return xxhash.xxh3_64_hexdigest(arr.tobytes())

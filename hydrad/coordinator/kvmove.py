"""KV state streamed engine to engine by the coordinator, and how fast that has been.

Two features move a slot's KV from one engine to another over their merged ports, with no disk
in between: a session moved off an engine that reloads or drains (``sessions``), and the
prefill/decode split, whose prefill engine hands the prompt's KV to the decode engine
(``frontdoor``). Both use :func:`stream_slot`. The split's plan needs the transfer's cost before
it makes one, so every transfer is recorded in a :class:`TransferMeter`: routing then prices a
transfer by what transfers really took on this pool, not by a guess.

The destination engine checks the state's identity (same file, or a sibling quant: same KV
family) before any byte is written, so an incompatible pair is refused and its slot untouched.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from hydrad.wire.kvdigest import tokens_digest
from hydrad.wire.rpcclient import RpcClient


@dataclass(frozen=True)
class Moved:
    """Where a slot's KV landed and what moving it took."""

    slot: int  # the destination slot now holding the KV
    n_tokens: int
    n_bytes: int
    seconds: float  # both connections, the stream and the destination's restore


def stream_slot(src: str, slot: int, dst: str, token: str | None, timeout: float,
                digest: str | None = None) -> Moved | None:
    """Stream ``src``'s slot into the emptiest idle slot of ``dst`` (host:port of merged ports).

    ``digest`` (``hydrad.wire.kvdigest`` of the tokens the caller expects there): when the slot's
    token list no longer hashes to it, the slot has moved on to another request and nothing is
    written. None when nothing was moved for such a reason (no idle slot, another request's KV);
    a refusal by the destination (another model, other cache types) raises ``RpcError``.
    Blocking: call it on a worker thread.
    """
    t0 = time.monotonic()
    with RpcClient(src, token, timeout=timeout) as a, RpcClient(dst, token, timeout=timeout) as b:
        slots = b.info().get("slots") or []
        idle = sorted((s for s in slots if not s.get("busy")), key=lambda s: (s.get("n_tokens") or 0, s["id"]))
        if not idle:
            return None
        st = a.state_get(int(slot))
        tokens = st.meta.get("tokens") or []
        if digest is not None and tokens_digest(tokens) != digest:
            for _ in st.chunks:  # drain the stream: the connection is closed next anyway, but cleanly
                pass
            return None
        r = b.state_put(int(idle[0]["id"]), st.meta, st.chunks)
    return Moved(int(r.get("slot", idle[0]["id"])), int(r.get("n_tokens", len(tokens))),
                 int(st.meta.get("bytes") or 0), time.monotonic() - t0)


class Placements:
    """One KV placement into an engine at a time. Every placement (a move, a restore from the Store, the
    split's transfer) reads the destination's idle slots and writes into the emptiest: two at once would
    pick the same slot, and the second would overwrite the first (its session's pinned turn would find
    another conversation's tokens there and prefill). Placements into different engines run in
    parallel. Owned by the event loop."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, engine: str) -> asyncio.Lock:
        return self._locks.setdefault(engine, asyncio.Lock())


LARGE_TRANSFER = 4 << 20  # bytes from which a transfer's time is mostly bandwidth, not its fixed part


class TransferMeter:
    """Measured engine-to-engine KV transfers: a fixed cost per transfer (two connections, INFO, the
    source's snapshot, the destination's restore call) plus bytes at a speed, and the bytes per token
    of each KV family.

    The speed is learned from large transfers only (at least :data:`LARGE_TRANSFER` bytes), where the
    fixed part is small; the fixed part from every transfer, as its time beyond what the speed
    explains. Both are exponential moving averages (weight ``alpha`` for the newest), so a pool whose
    network changes is re-learned within a few transfers. Owned by the event loop."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.bytes_per_s = 0.0  # 0 = nothing measured yet
        self.fixed_s = 0.0
        self.per_token: dict[str, float] = {}
        self.transfers = 0

    def record(self, moved: Moved, family: str | None) -> None:
        if not (moved.seconds > 0 and math.isfinite(moved.seconds)) or moved.n_bytes <= 0:
            return
        self.transfers += 1
        if moved.n_bytes >= LARGE_TRANSFER or self.bytes_per_s <= 0:
            self.bytes_per_s = self._ema(self.bytes_per_s, moved.n_bytes / moved.seconds)
        self.fixed_s = self._ema(self.fixed_s, max(0.0, moved.seconds - moved.n_bytes / self.bytes_per_s), zero_ok=True)
        if family and moved.n_tokens > 0:
            self.per_token[family] = self._ema(self.per_token.get(family, 0.0), moved.n_bytes / moved.n_tokens)

    def bytes_per_token(self, family: str | None) -> float:
        return self.per_token.get(family or "", 0.0)

    def _ema(self, old: float, new: float, zero_ok: bool = False) -> float:
        if not math.isfinite(new):
            return old
        first = self.transfers <= 1 if zero_ok else old <= 0
        return new if first else (1 - self.alpha) * old + self.alpha * new

    def public(self) -> dict[str, object]:
        return {"transfers": self.transfers, "bytes_per_s": round(self.bytes_per_s), "fixed_s": round(self.fixed_s, 5),
                "bytes_per_token": {k: round(v, 1) for k, v in sorted(self.per_token.items())}}


__all__ = ["Moved", "TransferMeter", "stream_slot"]

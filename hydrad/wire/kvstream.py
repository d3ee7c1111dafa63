"""The KV state stream: STATE_META, STATE_DATA…, STATE_END frames, shared by the merged port
and the HTTP twins so a state fetched over one can be restored over the other.

Integrity is checked with xxh3-128 over the data (tens of GB/s here, where sha256 runs at
about 1.3 GB/s and would halve the transfer rate); TCP already guards against line noise, the
hash guards against truncation and bugs.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import xxhash

from hydrad.wire import protocol as P

DEFAULT_CHUNK = 2 << 20


def fresh(size: int) -> Any:
    """A new uint8 array of ``size`` bytes, not zero-filled (every byte is written before use)."""
    import numpy as np  # after libllama (the engine preloads it first)

    return np.empty(size, dtype=np.uint8)


def chunked(meta: dict[str, Any], data: Any, chunk_size: int = DEFAULT_CHUNK,
            data_code: int = P.Status.STATE_DATA, end_code: int = P.Status.STATE_END,
            meta_code: int | None = P.Status.STATE_META) -> Iterator[bytes | memoryview]:
    """Frames of one state stream. Data slices are yielded as views (header first): no copy."""
    view = memoryview(data).cast("B")
    if meta_code is not None:
        yield P.encode_json(meta_code, meta)
    h = xxhash.xxh3_128()
    chunks = 0
    for off in range(0, len(view), chunk_size):
        piece = view[off:off + chunk_size]
        h.update(piece)
        yield P.HEADER.pack(data_code, len(piece))
        yield piece
        chunks += 1
    yield P.encode_json(end_code, {"bytes": len(view), "chunks": chunks, "xxh3_128": h.hexdigest()})


class StateReceiver:
    """Collects STATE_DATA payloads into one preallocated buffer (never more than declared)."""

    def __init__(self, total: int, take: Callable[[int], Any] | None = None) -> None:
        """``take``: where the buffer comes from (the engine's kept state buffers); a fresh one otherwise."""
        self.total = total
        self.buffer = (take or fresh)(total)
        self._view = memoryview(self.buffer)
        self.received = 0
        self.chunks = 0
        self._hash = xxhash.xxh3_128()

    def add(self, payload: bytes | memoryview) -> None:
        n = len(payload)
        if self.received + n > self.total:
            raise P.ProtocolError(f"state data exceeds the declared {self.total} bytes", P.Status.TOO_LARGE)
        self._view[self.received:self.received + n] = payload
        self._hash.update(payload)
        self.received += n
        self.chunks += 1

    def verify(self, end: dict[str, Any]) -> str | None:
        if self.received != self.total:
            return f"received {self.received} of {self.total} declared bytes"
        if end.get("bytes") != self.total:
            return f"STATE_END says {end.get('bytes')!r} bytes, meta declared {self.total}"
        digest = end.get("xxh3_128")
        if digest is not None and digest != self._hash.hexdigest():
            return "xxh3_128 of the received data does not match STATE_END"
        return None


class StreamAssembler:
    """The frames of one state stream, in their one valid order: STATE_META, STATE_DATA..., STATE_END.

    ``open`` sees the meta and returns the receiver for its data (or raises the caller's refusal);
    anything out of order is a ProtocolError. One rule for every consumer of a state stream (HTTP's
    ``PUT /slots/{id}/state``, the parser fuzzer), so they cannot drift."""

    def __init__(self, open: Callable[[dict[str, Any]], StateReceiver]) -> None:
        self._open = open
        self.meta: dict[str, Any] | None = None
        self.rx: StateReceiver | None = None
        self.end: dict[str, Any] | None = None

    def add(self, frame: P.Frame) -> None:
        if self.end is not None:
            raise P.ProtocolError("frames after STATE_END", P.Status.BAD_REQUEST)
        if self.meta is None:
            if frame.code != P.Status.STATE_META:
                raise P.ProtocolError("a state stream starts with STATE_META", P.Status.BAD_REQUEST)
            self.meta = frame.json()
            self.rx = self._open(self.meta)
        elif frame.code == P.Status.STATE_DATA:
            assert self.rx is not None
            self.rx.add(frame.payload)
        elif frame.code == P.Status.STATE_END:
            self.end = frame.json()
        else:
            raise P.ProtocolError(f"unexpected frame 0x{frame.code:02x} in a state stream", P.Status.BAD_REQUEST)

    @property
    def complete(self) -> bool:
        return self.meta is not None and self.rx is not None and self.end is not None


def meta_json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, separators=(",", ":"))

"""A reusable host buffer for KV state: snapshots (STATE_GET, ``GET /slots/{id}/state``) and
uploads being received (STATE_PUT and its HTTP twin).

A fresh buffer for each snapshot costs more than the snapshot: a 95 MB state took 100 ms to
reach its first frame on the 2-core machine, almost all of it page faults of the new mapping
(llama.cpp's own copy into an already-touched buffer took 4 ms). So the last buffer is kept for
the next snapshot. It goes back to the pool when the snapshot handed out is garbage, which is
when every view of it (the frames being sent) is gone, so a buffer is never reused while a
transfer still reads it; a second snapshot during a transfer simply gets a new buffer.

Kept memory is bounded: one buffer, at most ``KEEP_MAX_BYTES``, dropped after ``IDLE_S``
seconds unused (``trim`` runs from the engine loop) and when the engine stops.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from hydrad.wire.kvstream import fresh

KEEP_MAX_BYTES = 1 << 30
IDLE_S = 60.0


def headroom(size: int) -> int:
    """What a kept buffer is allocated with for ``size``: room for the session's next state, a few
    tokens longer (pages never touched cost nothing)."""
    return size + size // 4


class StateBuffers:
    def __init__(self, keep_max: int = KEEP_MAX_BYTES, idle_s: float = IDLE_S) -> None:
        self.keep_max = keep_max
        self.idle_s = idle_s
        self._lock = threading.Lock()  # taken by the engine thread and by whichever thread drops a snapshot
        self._spare: Any = None
        self._spare_at = 0.0
        self.reused = 0  # snapshots served from a kept buffer (for tests and metrics)

    def take(self, size: int) -> Any:
        """A uint8 array of exactly ``size`` bytes, contents undefined; back in the pool once dropped."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and size <= len(spare) <= 2 * size:
            base = spare
            self.reused += 1
        else:
            base = fresh(headroom(size))
        view = base[:size]
        if size <= self.keep_max:
            weakref.finalize(view, self._give_back, base)
        return view

    def _give_back(self, base: Any) -> None:
        with self._lock:
            if self._spare is None or len(base) >= len(self._spare):
                self._spare, self._spare_at = base, time.monotonic()

    @property
    def kept_bytes(self) -> int:
        spare = self._spare
        return len(spare) if spare is not None else 0

    def trim(self, now: float | None = None) -> None:
        """Drop the kept buffer once it has gone unused for ``idle_s``."""
        if self._spare is None:
            return
        with self._lock:
            if self._spare is not None and (now or time.monotonic()) - self._spare_at > self.idle_s:
                self._spare = None

    def clear(self) -> None:
        with self._lock:
            self._spare = None

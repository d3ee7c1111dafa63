"""``bench_load_stall --hold-alloc``: the serving steps wait, at a step's boundary, while a load beside
them allocates. Measured and not taken into the engine (docs/benchmarks.md).

On a GPU the step of a serving context that runs while a loader allocates the new model's buffers (its
weights' device buffer, one ``cudaMalloc``; for a read load four page-locked staging buffers,
``cudaMallocHost``) took longer than its neighbours. The idea tested here: let the loader have the
device to itself for them, the step in flight finishing first and the next waiting until they are done.
On an H100 the allocations took 3.7-4.0 ms of an otherwise idle device, so the held step took 6.5 ms
(2.4x the steady 2.7 ms), where the same step beside the allocations took 2.9-4.3 ms (1.1-1.6x): the
allocations do not stall a step by as long as they take, and overlapping them is the cheaper way.

llama.cpp gives no hook at the allocation, so :class:`AllocationWatch` finds it in the loader's own
log lines: the allocation follows the creation of the file's last tensor (each logged as
``create_tensor: loading tensor NAME``), and the first progress callback comes once the staging
buffers exist. The window is bounded on both sides (:data:`HOLD_LONGEST_S`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

HOLD_LONGEST_S = 0.03
"""The longest a step waits for a load's allocations, and the loader for the step in flight: a bound,
not a measure (a step took 2.7 ms, the allocations about 4)."""

_CREATED = b"create_tensor: loading tensor "
_UNUSED = b"model has unused tensor "


class StepHold:
    """A turnstile between the serving thread's steps and the loader's allocations.

    The serving thread brackets each ``llama_decode`` and the wait for its result with :meth:`enter_step`
    and :meth:`exit_step`; the loader brackets its allocations with :meth:`begin` and :meth:`end`."""

    def __init__(self, longest_s: float = HOLD_LONGEST_S) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._wanted = False  # a loader asked for the device (begin) and has not let it go (end)
        self._in_step = False
        self._t_held = 0.0
        self.longest_s = longest_s
        self.holds = 0  # windows held
        self.held_s = 0.0  # their total length
        self.steps_waited_s = 0.0  # how long steps waited for them in all

    def enter_step(self) -> None:
        with self._cv:
            if self._wanted:
                t0 = time.monotonic()
                self._cv.wait_for(lambda: not self._wanted, self.longest_s)
                self.steps_waited_s += time.monotonic() - t0
            self._in_step = True

    def exit_step(self) -> None:
        with self._cv:
            self._in_step = False
            if self._wanted:
                self._cv.notify_all()

    def begin(self) -> None:
        """The loader's side: no step starts until :meth:`end`, and the one in flight is waited for."""
        with self._cv:
            if self._wanted:
                return
            self._wanted = True
            self._cv.wait_for(lambda: not self._in_step, self.longest_s)
            self._t_held = time.monotonic()

    def end(self) -> None:
        with self._cv:
            if not self._wanted:
                return
            self._wanted = False
            self.holds += 1
            self.held_s += time.monotonic() - self._t_held
            self._cv.notify_all()


class AllocationWatch:
    """Holds ``hold`` from the creation of the last of ``names`` (the file's tensors) to the load's
    first upload. :meth:`line` takes each llama.cpp log line the loading thread writes;
    :meth:`wrap` the load's progress callback. The watch is for one load on one thread."""

    def __init__(self, hold: StepHold, names: frozenset[str]) -> None:
        self.hold = hold
        self._left = {n.encode() for n in names}
        self._thread = threading.get_ident()
        self._armed = bool(self._left)
        self.began: float | None = None  # monotonic times of the window
        self.ended: float | None = None

    def line(self, level: int, text: bytes) -> None:
        if not self._armed or threading.get_ident() != self._thread:
            return
        if text.startswith(_CREATED):
            name = text[len(_CREATED):].rstrip()
        elif text.startswith(_UNUSED):
            name = text[len(_UNUSED):].split(b" ", 1)[0]
        else:
            return
        self._left.discard(name)
        if not self._left:
            self._armed = False
            self.began = time.monotonic()
            self.hold.begin()

    def wrap(self, progress: Callable[[float], bool]) -> Callable[[float], bool]:
        """``progress``, ending the window at its first call (the first tensor's upload is next)."""
        def first_upload(value: float) -> bool:
            self.close()
            return progress(value)
        return first_upload

    def close(self) -> None:
        """End the window if it is open (the first upload, or the load's end whatever happened)."""
        self._armed = False
        if self.began is not None and self.ended is None:
            self.hold.end()
            self.ended = time.monotonic()

    @property
    def held_s(self) -> float | None:
        return None if self.began is None or self.ended is None else self.ended - self.began

"""Freeing retired generations off the engine thread.

An overlap reload hands new requests to the new generation at once and retires the old one when
its last request ends. Freeing it (``llama_free``, ``llama_model_free``: on a GPU, ``cudaFree`` of
its KV cache and weights, which waits for the device) used to run on the engine thread between two
steps, so every stream of the new generation waited for it. The reaper is one thread of its own
that frees what the engine thread hands it, in order, and logs how long each part took; the engine
thread steps on meanwhile.

Even off the engine thread a free is not free: while the driver releases device memory the serving
generation's next launches wait. So a generation is freed in parts (its context, then its weights),
with ``pause_s`` between them, and may be held ``delay_s`` first: no request then waits for the whole
of it. :meth:`Reaper.hurry` drops the waits (a load needs the memory; shutdown).

Only the engine thread calls :meth:`Reaper.bury`; a generation handed over is never touched by it
again (it is out of ``gen``, ``retiring`` and ``standby``), so the reaper is its only owner.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Protocol

from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread

log = logging.getLogger("hydrad.engine")


class Freeable(Protocol):
    def free_parts(self) -> list[tuple[str, Callable[[], None]]]:
        """(name, free) for each part, in the order they must be freed."""
        ...


class Reaper:
    """One thread that frees retired generations; :meth:`wait` until it has freed all it was given."""

    def __init__(self, delay_s: float = 0.0, pause_s: float = 0.0) -> None:
        self.delay_s, self.pause_s = delay_s, pause_s
        self._queue: queue.SimpleQueue[tuple[Freeable, str, str, float, int]] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._pending = 0
        self.held_bytes = 0  # memory of what was handed over and is not freed yet (counts as free for a load)
        self._hurry = threading.Event()  # set: no delay or pause until everything handed over is freed
        self._thread: threading.Thread | None = None
        self.freed = 0  # generations freed so far (tests read it)

    def bury(self, gen: Freeable, fingerprint: str, why: str, nbytes: int = 0) -> None:
        """Free ``gen`` (about ``nbytes`` of memory) on the reaper thread (started on first use)."""
        with self._cv:
            self._pending += 1
            self.held_bytes += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hydrad-reaper", daemon=True)
                self._thread.start()
        self._queue.put((gen, fingerprint, why, time.monotonic(), nbytes))

    def hurry(self) -> None:
        """Free what is held without waiting (its memory is wanted now)."""
        with self._cv:
            if self._pending:
                self._hurry.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether everything handed over was freed within ``timeout`` seconds. The engine thread waits
        here before it ends: llama.cpp's backends must outlive every generation using them."""
        self.hurry()
        with self._cv:
            return self._cv.wait_for(lambda: self._pending == 0, timeout)

    def _sleep_until(self, t: float) -> None:
        left = t - time.monotonic()
        if left > 0:
            self._hurry.wait(left)

    def _run(self) -> None:
        name_os_thread()
        while True:
            gen, fingerprint, why, since, nbytes = self._queue.get()
            self._sleep_until(since + self.delay_s)
            started = time.monotonic()
            parts: list[str] = []
            starts: list[str] = []  # when each part began, ms after the first: what a reader places a stall by
            first = 0.0
            spent = 0.0
            try:
                for i, (name, free) in enumerate(gen.free_parts()):
                    if i:
                        self._sleep_until(time.monotonic() + self.pause_s)
                    t = time.monotonic()
                    first = first or t
                    starts.append(f"{(t - first) * 1000:.1f}")
                    free()
                    ms = (time.monotonic() - t) * 1000
                    spent += ms
                    parts.append(f"{name}:{ms:.1f}")
            except Exception:  # noqa: BLE001 - a failed free leaks (the rest of) that generation; the engine goes on
                log.exception("freeing a retired generation failed")
            log_event(log, logging.INFO, "generation retired", generation=fingerprint, why=why,
                      free_ms=round(spent, 1), parts=",".join(parts), starts_ms=",".join(starts),
                      held_ms=round((started - since) * 1000, 1))
            with self._cv:
                self._pending -= 1
                self.held_bytes -= nbytes
                self.freed += 1
                if not self._pending:
                    self._hurry.clear()
                self._cv.notify_all()

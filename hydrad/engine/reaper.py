"""Freeing retired generations off the engine thread.

An overlap reload hands new requests to the new generation at once and retires the old one when
its last request ends. Freeing it (``llama_free``, ``llama_model_free``: on a GPU, ``cudaFree`` of
its weights and KV cache, which waits for the device) used to run on the engine thread between two
steps, so every stream of the new generation waited for it. The reaper is one thread of its own
that frees what the engine thread hands it, in order, and logs how long each took; the engine
thread steps on meanwhile.

Only the engine thread calls :meth:`Reaper.bury`; a generation handed over is never touched by it
again (it is out of ``gen``, ``retiring`` and ``standby``), so the reaper is its only owner.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

from hydrad.common.logs import log_event

log = logging.getLogger("hydrad.engine")


class Freeable(Protocol):
    def free(self) -> None: ...


class Reaper:
    """One thread that frees retired generations; :meth:`wait` until it has freed all it was given."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Freeable, str, str]] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self.freed = 0  # generations freed so far (tests read it)

    def bury(self, gen: Freeable, fingerprint: str, why: str) -> None:
        """Free ``gen`` on the reaper thread (started on first use)."""
        with self._cv:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hydrad-reaper", daemon=True)
                self._thread.start()
        self._queue.put((gen, fingerprint, why))

    def wait(self, timeout: float | None = None) -> bool:
        """Whether everything handed over was freed within ``timeout`` seconds. The engine thread waits
        here before it ends: llama.cpp's backends must outlive every generation using them."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            gen, fingerprint, why = self._queue.get()
            t0 = time.perf_counter()
            try:
                gen.free()
            except Exception:  # noqa: BLE001 - a failed free leaks that generation; the engine goes on
                log.exception("freeing a retired generation failed")
            log_event(log, logging.INFO, "generation retired", generation=fingerprint, why=why,
                      free_ms=round((time.perf_counter() - t0) * 1000, 1))
            with self._cv:
                self._pending -= 1
                self.freed += 1
                self._cv.notify_all()

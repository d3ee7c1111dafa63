"""Noticing when a daemon's event loop is held up, and where it was.

Every request of a daemon passes its event loop twice or more: its arrival (parsing, routing) and
its answer (the body, the write). A loop held by one long callback, or waiting for the interpreter
lock another thread holds, delays every request then in flight, and none of the requests' own timings
see it (``timings.server_ms`` starts when the handler runs). On the GPU host an overlap reload's worst
gaps had about 20 ms of a request's time outside its handler (docs/benchmarks.md, "Overlap reload");
this says whether that time was the engine's loop.

:class:`LoopWatch` is one thread that asks the loop to run a callback every ``threshold`` and waits
for it. When it has not run within ``threshold``, the watch notes the loop thread's innermost frames
then, waits for the callback, and logs how long the loop took and where it was. Each check costs the
loop one wake-up (a write to its self-pipe and a callback), so it is off unless asked for
(``logging.slow_loop_ms``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
import traceback

from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread


def where(frame: object, depth: int = 3) -> str:
    """The innermost ``depth`` frames of a stack, innermost first: ``file:line function`` each."""
    if frame is None:
        return "-"
    stack = traceback.extract_stack(frame)[-depth:]  # type: ignore[arg-type]
    return " < ".join(f"{s.filename.rsplit('/', 1)[-1]}:{s.lineno} {s.name}" for s in reversed(stack))


class LoopWatch:
    """Logs (info, ``event loop held``) each time ``loop`` took longer than ``threshold_s`` to run a
    callback handed to it from another thread, with how long and the loop thread's frames when the
    threshold passed. :meth:`start` must be called on the loop's own thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold_s: float, log: logging.Logger) -> None:
        self.loop, self.threshold_s, self.log = loop, threshold_s, log
        self._stop = threading.Event()
        self._loop_thread = 0
        self._thread: threading.Thread | None = None
        # (seconds, where) of the latest holds logged, for tests; bounded, as a daemon runs for weeks
        self.held: collections.deque[tuple[float, str]] = collections.deque(maxlen=64)

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="hydrad-looplag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        name_os_thread()
        while not self._stop.wait(self.threshold_s):
            ran = threading.Event()
            t0 = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(ran.set)
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            if ran.wait(self.threshold_s):
                continue
            at = where(sys._current_frames().get(self._loop_thread))
            while not ran.wait(0.1):
                if self._stop.is_set() or self.loop.is_closed():
                    return
            held = time.monotonic() - t0
            self.held.append((held, at))
            log_event(self.log, logging.INFO, "event loop held", ms=round(held * 1000, 1), where=at)

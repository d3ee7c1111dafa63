"""The engine's pulse: a thread with its own event loop for what tells the world the engine lives.

The bus link (REGISTER, heartbeats, CONFIGURE and the request stream's I/O) and the systemd
watchdog ping run here, on a loop that no request's work shares. The main event loop serves HTTP
and runs every request's coroutine (preparation hand-offs, the engine's events, answer
rendering); whatever holds it — a burst of answers, a slow client, a bug — would otherwise also
silence the heartbeat, and the coordinator would declare a live engine dead and fail every
stream on it.

A pulse that went on beating for a main loop hung for good would lie the other way, so the main
loop ticks a timestamp (:class:`LoopTicker`) and the pulse's users treat a loop that has not
ticked for :data:`MAIN_LOOP_DEAD_S` as dead: the heartbeat reports the stage ``failed`` and the
watchdog ping is withheld, so routing stops and systemd restarts the unit. A stall shorter than
that is a busy engine, not a dead one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

MAIN_LOOP_DEAD_S = 30.0
"""A main loop that has not run a pass for this long is hung, not busy: nothing may hold it that long."""

TICK_S = 0.1


class LoopTicker:
    """Runs on the main loop and notes when it last ran, so another thread can tell a stall."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick(), name="loop-ticker")

    async def _tick(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(TICK_S)

    def stalled_for(self) -> float:
        """Seconds since the main loop last ran its ticker (about 0 while it runs freely)."""
        return max(0.0, time.monotonic() - self.last - TICK_S)

    def hung(self) -> bool:
        return self._task is not None and self.stalled_for() > MAIN_LOOP_DEAD_S

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Pulse:
    """One daemon thread running one event loop; coroutines are handed to it from any thread."""

    def __init__(self, name: str = "pulse") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            loop.call_soon(started.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the pulse thread did not start")

    def spawn(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the pulse loop; the future resolves (in the pulse thread) with its result."""
        assert self.loop is not None, "Pulse.start() first"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """From another loop: run ``coro`` on the pulse loop and wait for it there."""
        return await asyncio.wrap_future(self.spawn(coro))

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the pulse loop, stop it and join the thread."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout + 1)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

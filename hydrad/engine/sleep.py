"""The idle sleep (llama-server's ``--sleep-idle-seconds``, the runtime parameter ``sleep_idle_seconds``).

An engine that has had no request for that many seconds frees its model (weights, context, KV) and
reports the stage ``sleeping``; the model it frees stays the configured one. The first request
afterwards (HTTP, the merged port or the bus) loads that model again and waits for it exactly as a
request that arrives during any load does (bounded by ``reload_queue_timeout_s``), then is served:
it is never refused because the engine slept. The coordinator routes to a sleeping engine as to one
that can load its model (``hydrad.coordinator.routing``).

State has one owner each: this watcher decides when to sleep (on the event loop); the control layer
starts the load that wakes (:meth:`hydrad.engine.control.EngineControl.wake`); the core carries the
sleeping model's name (``EngineCore.asleep``) that every view and door reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from hydrad.common.logs import log_event

if TYPE_CHECKING:
    from hydrad.engine.control import EngineControl

log = logging.getLogger("hydrad.sleep")

MAX_TICK_S = 1.0  # how often the watcher looks at an engine that may sleep (finer for short idle limits)


class IdleSleep:
    """Watches an engine for ``sleep_idle_seconds`` without work and puts it to sleep."""

    def __init__(self, control: EngineControl) -> None:
        self.control = control
        self.idle_since = time.monotonic()  # when the watcher last saw the engine busy (or loading)

    def limit(self) -> float:
        """The idle limit in force, in seconds; 0 when the engine never sleeps."""
        params = self.control.core.params
        n = params.sleep_idle_seconds if params is not None else -1
        return float(n) if n > 0 else 0.0

    def tick(self) -> float:
        n = self.limit()
        return MAX_TICK_S if n == 0 else min(MAX_TICK_S, max(0.02, n / 10))

    async def run(self) -> None:
        """The watcher: a task for the engine's lifetime."""
        while True:
            await asyncio.sleep(self.tick())
            try:
                await self.check()
            except Exception as exc:  # a failed unload leaves the engine as it was; say so, keep watching
                log_event(log, logging.ERROR, "idle sleep failed", error=str(exc))
                self.idle_since = time.monotonic()

    def _busy(self) -> bool:
        core = self.control.core
        busy, _, queued = core.slots_view().values()
        return bool(busy or queued or core.current_load is not None or core.retiring or core.embeds.jobs
                    or core.standby is not None or not core.admitting)

    async def check(self) -> bool:
        """Sleep now if the engine has been idle for the limit; whether it went to sleep."""
        core = self.control.core
        now = time.monotonic()
        if self._busy():
            self.idle_since = now
            return False
        n = self.limit()
        if n == 0 or core.gen is None or core.asleep is not None:
            return False
        idle = now - max(self.idle_since, core.t_last_request)
        if idle < n:
            return False
        await self.sleep(idle)
        return True

    async def sleep(self, idle_s: float) -> None:
        core = self.control.core
        gen = core.gen
        if gen is None:
            return
        model = gen.resolved.id
        t0 = time.monotonic()
        log_event(log, logging.INFO, "idle: freeing the model until the next request", model=model,
                  idle_s=round(idle_s, 1))
        # named before the model goes, so that a request arriving while it is freed finds it asleep (and
        # waits for the wake-up below) rather than an engine with no model at all
        core.asleep = model
        await core.unload()
        self.idle_since = time.monotonic()
        if core.asleep is None or core.current_load is not None:  # a configure or a request came meanwhile
            return
        core.stats.sleeps_total += 1
        core.set_stage("sleeping")
        if core.queued or core.t_last_request >= t0:  # a request came while the model was being freed
            self.control.wake()

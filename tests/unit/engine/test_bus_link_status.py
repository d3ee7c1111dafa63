"""An engine whose engine thread died says so in its very next heartbeat (stage ``failed``), so the
coordinator stops routing to it at once instead of after the watchdog restarts it. A real engine
core (no model needed): its thread is made to end, as a crash would end it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hydrad.engine.bus.link import EngineLink
from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.common.registry import Registry
from hydrad.engine.settings import EngineSettings


def test_a_dead_engine_thread_is_reported_as_failed() -> None:
    async def scenario() -> tuple[str, str, str | None]:
        core = EngineCore()
        core.start(asyncio.get_running_loop())
        control = EngineControl(core, Registry.load(None, Path(".")), {})
        link = EngineLink(EngineSettings(name="t", bus={"endpoint": "tcp://127.0.0.1:9"}), control, http=None, rpc=None)
        alive = link._status().stage
        core.stop()  # the thread ends without the daemon's shutdown, i.e. as if it had crashed
        await asyncio.to_thread(core.join, 10)
        assert not core.alive
        dead = link._status()
        return alive, dead.stage, dead.last_error

    alive, dead, error = asyncio.run(scenario())
    assert alive == "idle"
    assert dead == "failed" and error and "engine thread" in error

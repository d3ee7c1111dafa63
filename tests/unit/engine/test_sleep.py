"""The idle sleep's decisions (hydrad.engine.sleep), on a stand-in core: when it sleeps, and that a
request arriving while the model is being freed is woken for rather than left without a model.
tests/integration/test_sleep_idle.py runs it on a real engine."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.engine.sleep import IdleSleep
from hydrad.engine.stats import EngineStats


class Core:
    def __init__(self, limit: float) -> None:
        self.params = RuntimeParams(sleep_idle_seconds=limit)
        self.gen: Any = SimpleNamespace(resolved=SimpleNamespace(id="smol"))
        self.asleep: str | None = None
        self.current_load: Any = None
        self.retiring: list[Any] = []
        self.standby: Any = None
        self.admitting = True
        self.embeds = SimpleNamespace(jobs=[])
        self.stats = EngineStats()
        self.t_last_request = 0.0
        self.queued = 0
        self.busy = 0
        self.stages: list[str] = []
        self.during_unload: Any = None  # what happens while the model is being freed

    def slots_view(self) -> dict[str, int]:
        return {"busy": self.busy, "total": 2, "queued": self.queued}

    async def unload(self) -> None:
        if self.during_unload is not None:
            self.during_unload()
        self.gen = None

    def set_stage(self, stage: str) -> None:
        self.stages.append(stage)


def _watcher(core: Core) -> tuple[IdleSleep, list[str]]:
    woken: list[str] = []
    control = SimpleNamespace(core=core, wake=lambda: woken.append(core.asleep or "-"))
    return IdleSleep(control), woken  # type: ignore[arg-type]


def test_it_sleeps_only_after_the_limit_without_work_and_never_when_off() -> None:
    core = Core(limit=0.2)
    sleeper, woken = _watcher(core)
    assert not asyncio.run(sleeper.check())  # idle, but not for the limit yet
    core.busy = 1
    time.sleep(0.25)
    assert not asyncio.run(sleeper.check())  # a slot decodes: the idle clock starts again
    core.busy = 0
    assert not asyncio.run(sleeper.check())
    time.sleep(0.25)
    assert asyncio.run(sleeper.check())
    assert core.gen is None and core.asleep == "smol" and core.stages == ["sleeping"]
    assert core.stats.sleeps_total == 1 and woken == []
    off = Core(limit=-1)
    sleeper_off, _ = _watcher(off)
    sleeper_off.idle_since = 0.0
    assert not asyncio.run(sleeper_off.check()) and off.gen is not None


def test_a_request_that_came_while_the_model_was_freed_wakes_it() -> None:
    core = Core(limit=0.05)
    sleeper, woken = _watcher(core)
    sleeper.idle_since = 0.0

    def request_arrives() -> None:
        core.t_last_request = time.monotonic()
        core.queued = 1

    core.during_unload = request_arrives
    assert asyncio.run(sleeper.check())
    assert woken == ["smol"]  # the wake-up found the engine asleep with its model named

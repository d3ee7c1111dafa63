"""The console against a real pool: a hydra-coordinator process, one hydrad engine (SmolLM2) and
the console app run headless, reading the real PUB socket and admin API."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine
from tui.app import HydraConsole
from tui.feed import CONNECTED
from tui.widgets import EnginesTable, LoadsPanel

pytestmark = pytest.mark.model

PROFILES = {"profiles": {"solo": {"description": "console-a serves SmolLM2",
                                  "engines": {"console-a": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
            "default": "solo"}


def test_console_shows_a_real_engine(tmp_path: Path, smollm_path: Path,
                                     start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        app = HydraConsole(admin_url=c.url, events=c.events_endpoint, refresh_s=1.0)

        async def main() -> None:
            async with app.run_test(size=(140, 40)) as pilot:
                async def until(cond: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
                    deadline = time.monotonic() + timeout
                    while not cond():
                        if time.monotonic() > deadline:
                            raise AssertionError(f"{what} not seen within {timeout}s; engines "
                                                 f"{app.state.engines}\nevents {list(app.event_log.entries)}\n"
                                                 f"{c.log()[-3000:]}")
                        await pilot.pause(0.05)

                await until(lambda: app.feed_state == CONNECTED and app.snapshots >= 1, "console connected", 20)
                # the engine starts model-less after the console: it comes up over PUB and the
                # coordinator's profile makes it load SmolLM2
                start_engine(name="console-a", defaults={"n_ctx": 2048},
                             extra={"bus": {"endpoint": c.bus, "heartbeat_interval_s": 0.5}})
                table = app.query_one(EnginesTable)

                def row(column: str) -> str:
                    return str(table.get_cell("console-a", column)) if "console-a" in app.state.engines else ""

                await until(lambda: row("stage") == "ready" and row("model") == "smollm2-135m", "console-a ready")
                # slots come from the admin API, fetched again after the stage event
                await until(lambda: row("slots") == "0/2", "console-a slots", 10)
                assert row("mode") == "SOLO"
                assert app.admin_error is None and not app.banner.shown
                log = list(app.event_log.entries)
                assert any("console-a up:" in line for line in log), log  # seen on the PUB socket
                assert any("console-a" in line and "ready" in line for line in log), log
                assert not app.query_one(LoadsPanel).bars  # the load is over

                # a request through the front door: its routing decision shows up in the routing log
                async with httpx.AsyncClient(base_url=c.url, timeout=60) as http:
                    r = await http.post("/v1/chat/completions", json={
                        "model": "smollm2-135m", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "Say hi."}]})
                assert r.status_code == 200, r.text
                await until(lambda: any("→ console-a" in line for line in app.route_log.entries), "route", 20)

        asyncio.run(main())
    finally:
        c.stop()

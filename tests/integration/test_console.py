"""The console against a real pool: a hydra-coordinator process, hydrad engines (SmolLM2, Gemma) and
the console app run headless, reading the real PUB socket, the admin API and the engines' own HTTP
API; driven with Pilot's keys."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from textual.pilot import Pilot

from tests.support.coordinator import Coordinator
from tests.support.engine import REPO, Engine
from tests.support.wait import eventually_async
from tui.app import HydraConsole
from tui.feed import CONNECTED, DISCONNECTED
from tui.widgets import ConfirmSwitch, EngineScreen, EnginesTable, LoadsPanel, ProfilePicker, SwitchProgress

pytestmark = pytest.mark.model

PROFILES = {"profiles": {"solo": {"description": "console-a serves SmolLM2",
                                  "engines": {"console-a": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
            "default": "solo"}


def test_console_shows_a_real_engine(tmp_path: Path, smollm_path: Path,
                                     start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        app = HydraConsole(admin_url=c.url, events=c.events_endpoint, refresh_s=1.0, events_token=c.events_token)

        async def main() -> None:
            async with app.run_test(size=(140, 40)) as pilot:
                until = Watch(app, pilot, c).until

                await until(lambda: app.feed_state == CONNECTED and app.snapshots >= 1, "console connected", 20)
                # the engine starts model-less after the console: it comes up over PUB and the
                # coordinator's profile makes it load SmolLM2
                start_engine(name="console-a", defaults={"n_ctx": 2048},
                             extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
                table = app.query_one(EnginesTable)

                def row(column: str) -> str:
                    return str(table.get_cell("console-a", column)) if "console-a" in app.pool.engines else ""

                await until(lambda: row("stage") == "ready" and row("model") == "smollm2-135m", "console-a ready")
                # slots come from the admin API, fetched again after the stage event
                await until(lambda: row("slots") == "0/2", "console-a slots", 10)
                assert row("mode") == "SOLO"
                assert app.admin_error is None and not app.banner.shown
                # the stage-change event may trail the admin snapshot that made the row say ready
                await until(lambda: any("console-a" in line and "ready" in line for line in app.event_log.entries),
                            "console-a's ready event in the log", 10)
                await until(lambda: not app.query_one(LoadsPanel).bars, "the load's bar gone", 10)  # the load is over
                log = list(app.event_log.entries)
                assert any("console-a up:" in line for line in log), log  # seen on the PUB socket

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


# ----- two real engines (SmolLM2 and Gemma), the dev profiles -----------------------------------------

DEV_PROFILES = REPO / "etc" / "hydra" / "dev" / "profiles.yaml"
DEV = {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}
SWAPPED = {"dev-a": "gemma3-270m", "dev-b": "smollm2-135m"}


def _engines(c: Coordinator, start_engine: Callable[..., Engine], refuse_control: str | None = None) -> None:
    """dev-a and dev-b, model-less at boot: the coordinator's profile places them. ``refuse_control``:
    that engine's /control is closed to loopback (control_allow_from lists another network only)."""
    for name in ("dev-a", "dev-b"):
        extra: dict[str, Any] = {"bus": c.engine_bus(heartbeat_interval_s=0.5)}
        if name == refuse_control:
            extra["control_allow_from"] = ["10.255.0.0/16"]
        start_engine(name=name, defaults={"n_ctx": 2048, "n_parallel": 2}, extra=extra)


class Watch:
    """Waits on the console (with the pool's logs in the error when it times out) and reads its table."""

    def __init__(self, app: HydraConsole, pilot: Pilot[None], c: Coordinator) -> None:
        self.app, self.pilot, self.c = app, pilot, c

    def cell(self, engine: str, column: str) -> str:
        table = self.app.query_one(EnginesTable)
        if engine not in self.app.pool.engines or engine not in table._order:
            return ""
        return str(table.get_cell(engine, column))

    async def until(self, cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        await eventually_async(cond, timeout, what, sleep=self.pilot.pause, context=lambda: (
            f"engines {self.app.pool.engines}\nevents {list(self.app.event_log.entries)[-40:]}\n"
            f"{self.c.log()[-3000:]}"))

    def serving(self, wanted: dict[str, str]) -> bool:
        return all(self.cell(n, "stage") == "ready" and self.cell(n, "model") == m for n, m in wanted.items())


async def _open(w: Watch, name: str) -> EngineScreen:
    app, pilot = w.app, w.pilot
    table = app.query_one(EnginesTable)
    for _ in range(len(table._order)):
        if table.selected == name:
            break
        await pilot.press("down" if table._order.index(name) > table._order.index(table.selected or name) else "up")
    await pilot.press("enter")
    await w.until(lambda: isinstance(app.screen, EngineScreen), f"the screen of {name}", 10)
    screen = app.screen
    assert isinstance(screen, EngineScreen) and screen.engine == name
    await w.until(lambda: screen.fetches >= 1, f"{name}'s config and slots", 10)
    return screen


def test_console_two_engines_detail_and_switch_from_keys(tmp_path: Path, smollm_path: Path, gemma_path: Path,
                                                         start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=DEV_PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        app = HydraConsole(admin_url=c.url, events=c.events_endpoint, refresh_s=1.0, events_token=c.events_token)

        async def main() -> None:
            async with app.run_test(size=(132, 36)) as pilot:
                w = Watch(app, pilot, c)
                await w.until(lambda: app.feed_state == CONNECTED and app.snapshots >= 1, "console connected", 20)
                _engines(c, start_engine, refuse_control="dev-b")
                # rows appear, and each engine's stage changes as the coordinator places its model
                await w.until(lambda: w.serving(DEV), "both engines serving the dev profile")
                await w.until(lambda: w.cell("dev-a", "slots") == "0/2" and w.cell("dev-b", "slots") == "0/2",
                              "slots from the admin API", 10)
                assert w.cell("dev-a", "mode") == "SOLO" and w.cell("dev-b", "mode") == "SOLO"
                # its stage change, as it happened: an event on the PUB socket, which may trail the
                # admin snapshot that showed the engine serving
                for name in DEV:
                    await w.until(lambda n=name: any(line.split(" ", 1)[1].startswith(f"{n} ") and "→ ready" in line
                                              for line in app.event_log.entries), f"{name}'s stage change to ready", 10)
                log = list(app.event_log.entries)
                for name, model in DEV.items():
                    assert any(f"{name} configuring → {model}" in line for line in log), "\n".join(log)
                assert not app.banner.shown and "profile dev" in app.sub_title

                # the engine screen: the engine's own parameters (source layer, tier), its slots, its events
                screen = await _open(w, "dev-a")
                assert screen.param_rows["n_ctx"] == ("2048", "yaml", "T2")
                assert screen.param_rows["n_parallel"] == ("2", "yaml", "T2")
                assert screen.param_rows["model"] == ("smollm2-135m", "runtime", "T3")
                assert screen.param_rows["n_batch"][1] == "default"
                assert [r[:2] for r in screen.slot_rows] == [("0", "idle"), ("1", "idle")]
                assert "dev-a" in str(screen.query_one("#events-text").render())
                # a long request: its slot shows busy, with tokens decoded and their rate
                done: list[int] = []

                def generate() -> None:
                    with httpx.Client(base_url=c.url, timeout=300) as h:
                        r = h.post("/v1/chat/completions", json={
                            "model": "smollm2-135m", "max_tokens": 160, "ignore_eos": True, "temperature": 0,
                            "session_id": "console-s1", "messages": [{"role": "user", "content": "Tell a story."}]})
                        done.append(r.status_code)
                        ids.append(r.json().get("id"))

                ids: list[str] = []
                t = threading.Thread(target=generate)
                t.start()
                try:
                    await w.until(lambda: any(r[1] == "busy" and r[3] not in ("-", "0") and r[4] != "-"
                                              for r in screen.slot_rows), "a busy slot with its tok/s", 60)
                finally:
                    await asyncio.get_running_loop().run_in_executor(None, t.join, 300)
                assert done == [200]
                tag = c.events.session_of(ids[0])  # the events name a session by a keyed hash, never its id
                await w.until(lambda: tag in str(screen.query_one("#sessions").render()),
                              "the session routed to dev-a", 10)
                assert "console-s1" not in str(screen.query_one("#sessions").render())
                await pilot.press("escape")
                await w.until(lambda: not isinstance(app.screen, EngineScreen), "back to the pool", 5)
                # dev-b refuses /control from loopback: said so, and its slots are still shown
                screen = await _open(w, "dev-b")
                assert "refuses /control/config from this host" in screen.params_message
                assert "control_allow_from" in screen.params_message
                assert [r[:2] for r in screen.slot_rows] == [("0", "idle"), ("1", "idle")]
                await pilot.press("escape")
                await w.until(lambda: not isinstance(app.screen, EngineScreen), "back to the pool", 5)

                # the switch, from the keys: the chooser says what each profile loads where
                await pilot.press("p")
                await w.until(lambda: isinstance(app.screen, ProfilePicker), "the profile chooser", 5)
                picker = app.screen
                assert isinstance(picker, ProfilePicker)
                assert "dev-a gemma3-270m · dev-b smollm2-135m" in picker.labels["swapped"]
                assert "now: reloads dev-a, dev-b" in picker.labels["swapped"]
                assert "now: nothing to reload" in picker.labels["dev"]
                await pilot.press("down", "enter")  # it opened on the active dev; swapped is next
                await w.until(lambda: isinstance(app.screen, ConfirmSwitch), "the confirmation", 10)
                confirm = app.screen
                assert isinstance(confirm, ConfirmSwitch)
                assert confirm.question == "Switch pool to swapped? This reloads 2 engines."
                assert confirm.plan_lines == ["reload dev-a: smollm2-135m → gemma3-270m (SOLO)",
                                              "reload dev-b: gemma3-270m → smollm2-135m (SOLO)"]
                await pilot.press("y")
                await w.until(lambda: isinstance(app.screen, SwitchProgress), "the switch's dialog", 5)
                view = app.screen
                assert isinstance(view, SwitchProgress)
                await w.until(lambda: view.phase in ("done", "failed", "refused"), "the end of the switch")
                assert view.phase == "done", (view.outcome, view.lines)
                assert view.outcome.startswith("Done: profile swapped is active in ")
                assert [line.split()[0] for line in view.lines] == ["dev-a", "dev-b"]
                assert all(" done in " in line for line in view.lines), view.lines
                log = list(app.event_log.entries)  # the console followed it step by step
                assert any("profile dev → swapped: reloading dev-a, dev-b" in line for line in log), "\n".join(log)
                for name, model in SWAPPED.items():
                    assert any(f"{name} configuring → {model} (profile swapped)" in line for line in log), \
                        "\n".join(log)
                await pilot.press("escape")
                await w.until(lambda: w.serving(SWAPPED), "the table showing the swapped models", 30)
                # the stage change of the reload (a fast one may start and end between two heartbeats)
                log = list(app.event_log.entries)
                assert any(f"{name} ready → reloading" in line for line in log for name in SWAPPED), "\n".join(log)
                assert app.pool.profile.active == "swapped" and "profile swapped" in app.sub_title
                assert any("Profile swapped is active" in text for _, text in app.notices)

        asyncio.run(main())
    finally:
        c.stop()


def test_console_survives_the_coordinator_going_away(tmp_path: Path, smollm_path: Path, gemma_path: Path,
                                                     start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=DEV_PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        _engines(c, start_engine)
        c.wait_serving(DEV, 120)
        r = c.http.post("/admin/profile", json={"name": "swapped"})  # the active profile outlives the restart
        assert r.status_code == 200, r.text
        c.wait_serving(SWAPPED, 60)
        app = HydraConsole(admin_url=c.url, events=c.events_endpoint, refresh_s=0.5, events_token=c.events_token)

        async def main() -> None:
            async with app.run_test(size=(80, 24)) as pilot:
                w = Watch(app, pilot, c)
                await w.until(lambda: app.feed_state == CONNECTED and w.serving(SWAPPED), "console connected", 30)
                assert c.kill() == 0
                await w.until(lambda: app.banner.shown and "Coordinator unreachable" in app.banner.text
                              and app.feed_state == DISCONNECTED, "the console noticing", 20)
                assert app.sub_title.startswith("DISCONNECTED")
                assert w.cell("dev-a", "model") == "gemma3-270m"  # the last known state stays on screen
                await pilot.pause(1.0)
                assert app.is_running
                c.start_again()
                c.wait_ready()
                await w.until(lambda: not app.banner.shown and app.feed_state == CONNECTED
                              and app.admin_error is None, "the console reconnecting", 30)
                await w.until(lambda: w.serving(SWAPPED) and app.pool.profile.active == "swapped",
                              "the engines back under the restarted coordinator, profile swapped", 60)
                assert not app.sub_title.startswith("DISCONNECTED")
                log = list(app.event_log.entries)
                assert any("answers again" in line for line in log), log
                assert any("events: connected" in line for line in log), log

        asyncio.run(main())
    finally:
        c.stop()

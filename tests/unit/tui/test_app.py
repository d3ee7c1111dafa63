"""The console app driven headless with Pilot: synthetic PUB events in, widgets checked.

No network: the app runs without its SUB reader (``events=None``) and the tests post the same
``PoolEvents`` messages the reader thread posts. The admin HTTP client is replaced by
:class:`FakeAdmin`, a fake used only for the admin HTTP client in these unit tests (the
integration test ``tests/integration/test_console.py`` runs against a real coordinator).
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any, Awaitable, Callable

import pytest
from textual.pilot import Pilot

from tui.app import HydraConsole
from tui.feed import AdminError, FeedEvent
from tui.widgets import (Banner, ConfirmSwitch, EngineDetail, EnginesTable, EventLog, LoadBar, LoadsPanel, ProfilePicker,
                         RouteLog, SwitchProgress)

GIB = 1 << 30


def engine_doc(name: str, **over: Any) -> dict[str, Any]:
    """One item of GET /admin/engines, shaped like the coordinator's EngineRecord.public()."""
    doc: dict[str, Any] = {
        "name": name, "alive": True, "down_reason": None, "last_seen_s": 0.3, "up_since": 1_700_000_000.0,
        "instance": "abc.1", "version": "0.1.0", "pid": 4242, "http": "127.0.0.1:8080", "rpc": "127.0.0.1:9503",
        "gpu": {"name": "CUDA0", "description": "NVIDIA GeForce RTX 5060 Ti", "kind": "gpu", "arch": "sm_120",
                "vram_total": 16 * GIB, "vram_free": 12 * GIB},
        "models_on_disk": ["gemma3-270m", "smollm2-135m"], "heartbeat_interval_s": 1.0,
        "stage": "ready", "model": "smollm2-135m", "generation": "hydra-3f2a9c1d7e", "mode": "solo",
        "progress": None, "load_id": 1, "loading_model": None, "slots_busy": 1, "slots_total": 4, "queued": 0,
        "max_queue": 64, "n_ctx": 8192, "prefill_tps": 812.0, "decode_tps": 95.4, "load_seconds": 1.2,
        "vram_free": 12 * GIB, "last_error": None, "inflight": 1, "sessions": 2, "configuring": None,
    }
    doc.update(over)
    return doc


def engines_doc() -> dict[str, Any]:
    return {"profile": "dense", "engines": [
        engine_doc("5060ti"),
        engine_doc("p100", gpu={"name": "CUDA1", "description": "Tesla P100-PCIE-16GB", "kind": "gpu", "arch": "sm_60",
                                "vram_total": 16 * GIB, "vram_free": 15 * GIB},
                   model="gemma3-270m", slots_busy=0, slots_total=2, decode_tps=41.0, vram_free=15 * GIB),
    ]}


def profile_doc() -> dict[str, Any]:
    return {"active": "dense", "previous": None, "state": "steady",
            "profiles": {"dense": "each GPU serves a model of its own", "gemma": "every GPU serves Gemma-3-270M"},
            "engines": {"5060ti": {"entry": {"model": "smollm2-135m"}, "alive": True, "model": "smollm2-135m",
                                   "stage": "ready", "matches": True, "configuring": None},
                        "p100": {"entry": {"model": "gemma3-270m"}, "alive": True, "model": "gemma3-270m",
                                 "stage": "ready", "matches": True, "configuring": None}},
            "progress": {}, "last_switch": None}


class FakeAdmin:
    """Stands in for the admin HTTP client only (unit tests have no coordinator); thread-safe enough
    for the app's thread workers. ``fail`` makes every call raise like an unreachable coordinator."""

    def __init__(self) -> None:
        self.engines_answer = engines_doc()
        self.profile_answer = profile_doc()
        self.fail: str | None = None
        self.switch_error: str | None = None
        self.switched: list[str] = []
        self.calls = 0
        self._lock = threading.Lock()

    def engines(self) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            if self.fail:
                raise AdminError(self.fail)
            return copy.deepcopy(self.engines_answer)

    def profile(self) -> dict[str, Any]:
        with self._lock:
            if self.fail:
                raise AdminError(self.fail)
            return copy.deepcopy(self.profile_answer)

    def switch(self, name: str) -> dict[str, Any]:
        with self._lock:
            if self.switch_error:
                raise AdminError(self.switch_error, 409)
            self.switched.append(name)
            self.profile_answer.update(active=name, previous=self.profile_answer["active"])  # as the coordinator does
            return {"profile": name, "state": "switching"}


def ev(topic: str, **data: Any) -> FeedEvent:
    return FeedEvent(topic, 1_700_000_000.0, data)


def run(app: HydraConsole, body: Callable[[Pilot[None]], Awaitable[None]], size: tuple[int, int] = (140, 36)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot)

    asyncio.run(main())


async def until(pilot: Pilot[None], cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await pilot.pause(0.02)


def cell(app: HydraConsole, engine: str, column: str) -> str:
    return str(app.query_one(EnginesTable).get_cell(engine, column))


def make_app(admin: FakeAdmin | None = None, **kw: Any) -> HydraConsole:
    """Fetches the admin API once at start and on ``r`` only, so the fake's fixed answers never
    overwrite what the synthetic events say."""
    kw = {"refresh_s": 600, "refresh_on_events": False, **kw}
    return HydraConsole(admin=admin or FakeAdmin(), events=None, clock=lambda: 1000.0, **kw)


def test_initial_snapshot_fills_the_table() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        table = app.query_one(EnginesTable)
        assert table.row_count == 2
        assert cell(app, "5060ti", "gpu") == "RTX 5060 Ti sm_120"
        assert cell(app, "5060ti", "vram") == "4.0G/16.0G"
        assert cell(app, "5060ti", "stage") == "ready"
        assert cell(app, "5060ti", "model") == "smollm2-135m"
        assert cell(app, "5060ti", "mode") == "SOLO"
        assert cell(app, "5060ti", "slots") == "1/4"
        assert cell(app, "5060ti", "queue") == "0"
        assert cell(app, "5060ti", "decode") == "95.4"
        assert cell(app, "5060ti", "hb") == "0.3s"
        assert cell(app, "p100", "gpu") == "Tesla P100-PCIE-16GB sm_60"
        assert "dense" in app.sub_title and "2 up" in app.sub_title
        assert not app.query_one(Banner).shown

    run(app, body)


def test_mode_column_shows_the_pair_the_engines_report() -> None:
    """A COMBINE pair as the coordinator lists it: each row's Mode is the engine's own role and its
    pair by name, on the table and the engine's detail pane; not the profile's entries."""
    admin = FakeAdmin()
    admin.engines_answer = {"profile": "pair", "engines": [
        engine_doc("5060ti", model="gemma3-270m", mode="combine", role="head", peers=["127.0.0.1:9504"],
                   pair=["p100"], pair_peers=["p100"], pair_heads=[]),
        engine_doc("p100", model=None, stage="idle", mode="combine", role="peer", rpc="127.0.0.1:9504",
                   serving=["127.0.0.1:40112"], pair=["5060ti"], pair_peers=[], pair_heads=["5060ti"])]}
    app = make_app(admin)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        assert cell(app, "5060ti", "mode") == "COMBINE head→p100"
        assert cell(app, "p100", "mode") == "COMBINE peer←5060ti"  # the profile (dense) says SOLO for both
        detail = app.query_one(EngineDetail)
        await until(pilot, lambda: "mode  COMBINE head→p100" in str(detail.render()))

    run(app, body)


def test_detail_pane_has_no_mode_line_for_a_solo_engine() -> None:
    from tui.model import PoolModel
    from tui.widgets.detail import render_detail

    s = PoolModel()
    s.apply_engines(engines_doc())
    assert "\nmode  " not in render_detail(s, s.engines["5060ti"]).plain


def test_events_update_rows_and_add_engines() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.post_message(app.PoolEvents([
            ev("engine.up", engine="3060", http="127.0.0.1:8081", rpc=None, stage="idle", model=None,
               gpu={"name": "CUDA0", "description": "NVIDIA GeForce RTX 3060", "arch": "sm_86",
                    "vram_total": 12 * GIB, "vram_free": 11 * GIB}, previous_stage="starting"),
            ev("engine.stage", engine="5060ti", stage="reloading", previous="ready", model="smollm2-135m",
               loading_model="gemma3-270m"),
        ]))
        await until(pilot, lambda: app.query_one(EnginesTable).row_count == 3)
        assert cell(app, "3060", "stage") == "idle"
        assert cell(app, "3060", "gpu") == "RTX 3060 sm_86"
        assert cell(app, "5060ti", "stage") == "reloading"
        assert cell(app, "5060ti", "model") == "smollm2-135m→gemma3-270m"
        log = app.query_one(EventLog).entries
        assert any("3060 up: idle" in line for line in log)
        assert any("5060ti ready → reloading" in line for line in log)

    run(app, body)


def test_dead_engine_is_marked() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.post_message(app.PoolEvents([ev("engine.down", engine="p100", reason="disconnected")]))
        await until(pilot, lambda: cell(app, "p100", "stage") == "DEAD")
        table = app.query_one(EnginesTable)
        name = table.get_cell("p100", "engine")
        assert any("red" in str(span.style) and "dim" in str(span.style) for span in name.spans)
        assert "1 dead" in app.sub_title
        # the detail pane says why, once the dead engine is selected
        await pilot.press("down")
        await until(pilot, lambda: app.query_one(EngineDetail).engine == "p100")
        assert "disconnected" in str(app.query_one(EngineDetail).render())
        # a later snapshot still saying alive=false keeps it dead; alive again revives it
        admin: FakeAdmin = app.admin  # type: ignore[assignment]
        admin.engines_answer["engines"][1].update(alive=False, down_reason="disconnected")
        await pilot.press("r")
        await until(pilot, lambda: app.snapshots >= 2)
        assert cell(app, "p100", "stage") == "DEAD"
        admin.engines_answer = engines_doc()  # it came back: the event says so first, the admin API agrees
        app.post_message(app.PoolEvents([ev("engine.up", engine="p100", stage="ready", model="gemma3-270m")]))
        await until(pilot, lambda: cell(app, "p100", "stage") == "ready")

    run(app, body)


def test_progress_bars_follow_loads() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        loads = app.query_one(LoadsPanel)
        assert loads.bars == {}
        app.post_message(app.PoolEvents([
            ev("engine.stage", engine="p100", stage="loading_model", previous="idle", model=None,
               loading_model="smollm2-135m"),
        ]))
        await until(pilot, lambda: set(loads.bars) == {"p100"})
        app.post_message(app.PoolEvents([
            ev("engine.stage", engine="5060ti", stage="reloading", previous="ready", model="smollm2-135m",
               loading_model="gemma3-270m"),
            ev("engine.progress", engine="5060ti", stage="reloading", progress=0.25, loading_model="gemma3-270m",
               load_id=2),
        ]))
        await until(pilot, lambda: set(loads.bars) == {"5060ti", "p100"})
        await pilot.pause()
        assert [b.engine for b in loads.query(LoadBar)] == ["5060ti", "p100"]  # in name order, not arrival order
        assert loads.bars["5060ti"].percent == 25.0
        assert loads.bars["p100"].percent is None  # no progress yet: indeterminate
        assert cell(app, "5060ti", "stage") == "reloading 25%"
        app.post_message(app.PoolEvents([
            ev("profile.progress", profile="gemma", engine="5060ti", stage="reloading", progress=0.8,
               model="gemma3-270m"),
            ev("engine.progress", engine="p100", stage="loading_model", progress=0.5, loading_model="smollm2-135m"),
        ]))
        await until(pilot, lambda: loads.bars["5060ti"].percent == 80.0 and loads.bars["p100"].percent == 50.0)
        app.post_message(app.PoolEvents([
            ev("engine.stage", engine="5060ti", stage="ready", previous="reloading", model="gemma3-270m",
               loading_model=None),
        ]))
        await until(pilot, lambda: set(loads.bars) == {"p100"})
        assert cell(app, "5060ti", "model") == "gemma3-270m"

    run(app, body)


def test_routing_log() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.post_message(app.PoolEvents([
            ev("route", req="req-1", attempt=1, session="s1", engine="5060ti", model="smollm2-135m", step="affinity",
               reason="session s1 is warm on 5060ti", candidates=[], rejected={}),
            ev("route", req="req-2", attempt=1, session=None, engine=None, model="qwen", step="none",
               reason="no engine serves or can load qwen", candidates=[], rejected={"5060ti": "model: not on disk"}),
        ]))
        routes = app.query_one(RouteLog)
        await until(pilot, lambda: len(routes.entries) == 2)
        assert "req-1 → 5060ti [affinity] smollm2-135m" in routes.entries[0]
        assert "session s1 is warm" in routes.entries[0]
        assert "req-2 → none [none]" in routes.entries[1]
        assert not any("req-1" in line for line in app.query_one(EventLog).entries)

    run(app, body)


def test_profile_switch_flow() -> None:
    admin = FakeAdmin()
    app = make_app(admin)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.press("down", "enter")  # the picker opens on the active dense; one down is gemma
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        confirm = app.screen
        assert isinstance(confirm, ConfirmSwitch)
        assert confirm.question == "Switch pool to gemma? This reloads up to 2 engines."
        await pilot.press("y")
        await until(pilot, lambda: admin.switched == ["gemma"])
        await until(pilot, lambda: any("Switching the pool to gemma" in t for _, t in app.notices))
        assert isinstance(app.screen, SwitchProgress)  # the switch's own progress dialog
        await pilot.press("escape")  # closing it leaves the switch running
        await until(pilot, lambda: not isinstance(app.screen, SwitchProgress))
        app.post_message(app.PoolEvents([
            ev("profile.start", profile="gemma", previous="dense", engines=["5060ti"], absent=[], errors={}),
            ev("profile.engine", engine="5060ti", phase="configuring", why="profile gemma", model="gemma3-270m"),
            ev("engine.stage", engine="5060ti", stage="reloading", previous="ready", model="smollm2-135m",
               loading_model="gemma3-270m"),
            ev("profile.progress", profile="gemma", engine="5060ti", stage="reloading", progress=0.4,
               model="gemma3-270m"),
        ]))
        loads = app.query_one(LoadsPanel)
        await until(pilot, lambda: "5060ti" in loads.bars and loads.bars["5060ti"].percent == 40.0)
        assert app.pool.profile.state == "switching"
        await pilot.press("p")  # refused while a switch runs, with a notice, not a second modal
        await pilot.pause()
        assert not isinstance(app.screen, ProfilePicker)
        assert "under way" in app.notices[-1][1]
        app.post_message(app.PoolEvents([
            ev("engine.stage", engine="5060ti", stage="ready", previous="reloading", model="gemma3-270m",
               loading_model=None),
            ev("profile.engine", engine="5060ti", phase="done", ok=True, model="gemma3-270m", seconds=2.5),
            ev("profile.done", profile="gemma", ok=True, seconds=2.6, failed=[], absent=[]),
        ]))
        await until(pilot, lambda: any("Profile gemma is active in 2.6 s" in t for _, t in app.notices))
        assert loads.bars == {}
        assert app.pool.profile.active == "gemma"

    run(app, body)


def test_profile_switch_cancel_and_errors() -> None:
    admin = FakeAdmin()
    admin.switch_error = "POST /admin/profile: HTTP 409: a switch to 'dense' is under way"
    app = make_app(admin)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        # cancel at the chooser, then at the confirmation: nothing is posted
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProfilePicker))
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmSwitch))
        assert admin.switched == []
        # the coordinator refuses: an error notification, the app runs on
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        await pilot.click("#yes")
        await until(pilot, lambda: any(sev == "error" for sev, _ in app.notices))
        sev, text = app.notices[-1]
        assert sev == "error" and "HTTP 409" in text and "gemma" in text
        # a switch that fails on an engine
        app.post_message(app.PoolEvents([ev("profile.done", profile="gemma", ok=False, seconds=3.0,
                                            failed=["p100"], absent=[])]))
        await until(pilot, lambda: "failed on: p100" in app.notices[-1][1])
        assert app.is_running

    run(app, body)


def test_unreachable_coordinator_shows_banner_and_recovers() -> None:
    admin = FakeAdmin()
    admin.fail = "http://127.0.0.1:9000: connection refused"
    app = HydraConsole(admin=admin, events=None, refresh_s=0.2, clock=lambda: 1000.0)

    async def body(pilot: Pilot[None]) -> None:
        banner = app.query_one(Banner)
        await until(pilot, lambda: banner.shown)
        assert "Coordinator unreachable" in banner.text and "connection refused" in banner.text
        assert "Retrying every 0.2 s" in banner.text
        assert app.sub_title.startswith("DISCONNECTED")  # in the header too, in words
        calls = admin.calls
        await until(pilot, lambda: admin.calls >= calls + 2)  # it keeps retrying
        await pilot.press("p")  # nothing known: a notice, no modal
        await pilot.pause()
        assert "No profiles known" in app.notices[-1][1]
        admin.fail = None
        await until(pilot, lambda: not banner.shown)
        assert not app.sub_title.startswith("DISCONNECTED")
        assert app.query_one(EnginesTable).row_count == 2

    run(app, body)


def test_event_stream_down_is_a_warning_banner() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.events_endpoint = "tcp://127.0.0.1:9501"  # as if a reader ran
        app.post_message(app.FeedState("disconnected", "tcp://127.0.0.1:9501 not reachable; retrying"))
        banner = app.query_one(Banner)
        await until(pilot, lambda: banner.shown)
        assert "Event stream down" in banner.text and banner.has_class("-warning")
        app.post_message(app.FeedState("connected", "connected to tcp://127.0.0.1:9501"))
        await until(pilot, lambda: not banner.shown)

    run(app, body)


def test_arrow_keys_select_engine_and_show_slots() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        detail = app.query_one(EngineDetail)
        await until(pilot, lambda: detail.engine == "5060ti")
        text = str(detail.render())
        assert "■□□□  1/4 busy  queue 0/64" in text and "sessions 2" in text
        await pilot.press("down")
        await until(pilot, lambda: detail.engine == "p100")
        assert "□□  0/2 busy" in str(detail.render())
        await pilot.press("up")
        await until(pilot, lambda: detail.engine == "5060ti")
        # a new engine sorted in before the selection keeps the selection on the same engine
        app.post_message(app.PoolEvents([ev("engine.up", engine="0-first", stage="idle", model=None)]))
        await until(pilot, lambda: app.query_one(EnginesTable).row_count == 3)
        assert app.query_one(EnginesTable).selected == "5060ti"

    run(app, body)


def test_malformed_events_and_snapshots_do_not_crash() -> None:
    admin = FakeAdmin()
    admin.engines_answer = {"engines": [{"name": 3}, "junk", engine_doc("ok", gpu="not a dict")], "profile": 7}
    app = make_app(admin)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.post_message(app.PoolEvents([
            ev("engine.stage"), ev("engine.progress", engine="ok", progress="lots"), ev("unknown.topic", x=1),
            ev("profile.engine", engine="nobody", phase="done"), ev("route"),
        ]))
        await pilot.pause(0.1)
        assert app.is_running
        assert app.query_one(EnginesTable).row_count == 1

    run(app, body)


def test_events_bring_an_admin_refresh() -> None:
    admin = FakeAdmin()
    app = make_app(admin, refresh_on_events=True)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        admin.engines_answer["engines"][0]["slots_busy"] = 3
        app.post_message(app.PoolEvents([
            ev("route", req="req-9", engine="5060ti", model="smollm2-135m", step="cost", reason="cheapest")]))
        await until(pilot, lambda: cell(app, "5060ti", "slots") == "3/4")  # within a tick, not after refresh_s

    run(app, body)


def test_quit_key() -> None:
    app = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running

    run(app, body)


def test_event_reader_against_nothing_gives_the_warning_banner() -> None:
    from tests.support.engine import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    app = HydraConsole(admin=FakeAdmin(), events=endpoint, refresh_s=600, clock=lambda: 1000.0)

    async def body(pilot: Pilot[None]) -> None:
        await until(pilot, lambda: app.banner.shown)
        assert "Event stream down" in app.banner.text and endpoint in app.banner.text
        assert app.query_one(EnginesTable).row_count == 2  # the admin data is shown all the same

    run(app, body)


def test_command_line() -> None:
    from tui.app import _parse

    args = _parse([])
    assert (args.coordinator, args.admin, args.refresh) == ("tcp://127.0.0.1:9501", "http://127.0.0.1:9000", 2.0)
    args = _parse(["--coordinator", "tcp://gpu:19501", "--admin", "http://gpu:19000", "--refresh", "5"])
    assert (args.coordinator, args.admin, args.refresh) == ("tcp://gpu:19501", "http://gpu:19000", 5.0)
    for bad in (["--coordinator", "gpu:9501"], ["--admin", "gpu:9000"], ["--refresh", "0"],
                ["--curve-server-key", "short"]):
        with pytest.raises(SystemExit):
            _parse(bad)

"""The console's screens and dialogs, driven with Pilot over the recorded pool
(``tests/data/console-stream.json``, see ``tests/support/console_replay.py``): the engine screen,
load progress with ETA, the profile switch from chooser to outcome, help, an 80×24 terminal and
NO_COLOR. No network: the admin API and the engines' own HTTP APIs answer from the recording."""

from __future__ import annotations

import asyncio
import re
from typing import Awaitable, Callable

import pytest
from textual.pilot import Pilot

from tests.support.console_replay import make_app, replay, started
from tests.unit.tui.test_app import FakeAdmin, cell, ev, until
from tests.unit.tui.test_app import make_app as make_fake_app
from tui.app import HydraConsole
from tui.widgets import (ConfirmSwitch, EngineScreen, EnginesTable, HelpScreen, LoadsPanel, ProfilePicker,
                         ProfilesPanel, SwitchProgress)
from tui.widgets.help import KEYS

MID_SWITCH = 21.5  # the recording's switch dense → gemma: 3060 at 64%, p100 at 31%
AFTER_SWITCH = 30.0
SVG_CHROME = {"c5c8c6", "28c840", "febc2e", "ff5f57"}  # the exported SVG's window buttons and title


def run(app: HydraConsole, body: Callable[[Pilot[None]], Awaitable[None]], size: tuple[int, int] = (132, 36)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await started(app, pilot)
            await body(pilot)

    asyncio.run(main())


async def open_engine(app: HydraConsole, pilot: Pilot[None], name: str) -> EngineScreen:
    table = app.query_one(EnginesTable)
    await until(pilot, lambda: name in table._order)
    for _ in range(len(table._order)):
        if table.selected == name:
            break
        here, there = table._order.index(table.selected or name), table._order.index(name)
        await pilot.press("down" if there > here else "up")
    assert table.selected == name
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, EngineScreen))
    screen = app.screen
    assert isinstance(screen, EngineScreen) and screen.engine == name
    await until(pilot, lambda: screen.fetches >= 1)
    await pilot.pause()
    return screen


def test_engine_screen_shows_slots_params_and_events() -> None:
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await replay(app, clock, pilot, MID_SWITCH)
        screen = await open_engine(app, pilot, "5060ti")
        assert screen.slot_rows == [("0", "busy", "1466", "176", "58.2"), ("1", "busy", "733", "31", "61.7"),
                                    ("2", "idle", "2048", "-", "-"), ("3", "idle", "0", "-", "-")]
        # every parameter with its value, source layer and tier; the layers above the defaults first
        assert screen.param_rows["n_ctx"] == ("8192", "yaml", "T2")
        assert screen.param_rows["model"] == ("gemma3-270m", "runtime", "T3")
        assert screen.param_rows["top_k"] == ("64", "model", "T1")
        assert screen.param_rows["n_batch"] == ("2048", "default", "T2")
        assert len(screen.param_rows) == 36
        assert list(screen.param_rows)[:4] == ["model", "n_gpu_layers", "split_mode", "tensor_split"]
        assert "from http://10.0.0.11:8080" in screen.params_message
        text = str(screen.query_one("#sessions").render())
        assert "sessions routed here: s-c04e6b9d1a2f8e73" in text and "busy 2/4" in text
        events = str(screen.query_one("#events-text").render())
        assert "route e4a8b2c6d0f1 [affinity] gemma3-270m: session s-c04e6b9d1a2f8e73 is warm on 5060ti" in events
        assert "3060" not in events  # only this engine's
        # the engine keeps being fetched while the screen is open
        n = screen.fetches
        await pilot.press("r")
        await until(pilot, lambda: screen.fetches > n)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, EngineScreen))
        assert app.query_one(EnginesTable).selected == "5060ti"

    run(app, body)


def test_engine_screen_refused_by_control_allow_from_and_loading_engine() -> None:
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await replay(app, clock, pilot, MID_SWITCH)
        screen = await open_engine(app, pilot, "p100")
        assert "refuses /control/config from this host" in screen.params_message
        assert "control_allow_from" in screen.params_message
        assert not screen.query_one("#params").display and screen.param_rows == {}
        assert [r[:3] for r in screen.slot_rows] == [("0", "idle", "256"), ("1", "idle", "0"), ("2", "idle", "0"),
                                                     ("3", "idle", "0")]  # /slots is not behind control_allow_from
        summary = str(screen.query_one("#summary").render())
        assert "reloading → gemma3-270m  31% · 12s · ETA 25s" in summary
        # the screen follows events while it is open
        await replay(app, clock, pilot, 25.7)
        await until(pilot, lambda: "55%" in str(screen.query_one("#summary").render()))
        await pilot.press("escape")
        # an engine the coordinator gives no address for
        app.post_message(app.PoolEvents([ev("engine.up", engine="0-new", stage="idle", model=None)]))
        await until(pilot, lambda: "0-new" in app.pool.engines)
        screen = await open_engine(app, pilot, "0-new")
        assert screen.params_message == "the coordinator lists no HTTP address for this engine"

    run(app, body)


def test_engine_screen_of_a_dead_engine() -> None:
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await replay(app, clock, pilot, 5.0)
        app.post_message(app.PoolEvents([ev("engine.down", engine="3060", reason="disconnected")]))
        await until(pilot, lambda: not app.pool.engines["3060"].alive)
        screen = await open_engine(app, pilot, "3060")
        assert "DEAD (disconnected)" in str(screen.query_one("#summary").render())
        assert "3060 DOWN: disconnected" in str(screen.query_one("#events-text").render())

    run(app, body)


def test_reload_progress_per_engine_and_for_the_switch() -> None:
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await replay(app, clock, pilot, MID_SWITCH)
        loads = app.query_one(LoadsPanel)
        assert loads.switch_text == "switch → gemma: 0/2 engines done · 12s"
        assert loads.bars["3060"].text == "3060 reloading → gemma3-270m 64% · 12s · ETA 6.5s"
        assert loads.bars["p100"].text == "p100 reloading → gemma3-270m 31% · 12s · ETA 25s"
        assert loads.bars["3060"].percent == 64.0
        await replay(app, clock, pilot, 26.0)
        assert loads.switch_text == "switch → gemma: 1/2 engines done · 17s"
        assert set(loads.bars) == {"p100"}
        await replay(app, clock, pilot, AFTER_SWITCH)
        assert loads.switch_text is None and loads.bars == {}
        panel = str(app.query_one(ProfilesPanel).render())
        assert "last switch: gemma ok in 19.6 s" in panel

    run(app, body)


def test_profile_switch_chooser_plan_and_progress_until_done() -> None:
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        picker = app.screen
        assert isinstance(picker, ProfilePicker)
        # what each profile would load where, and what a switch to it would do now
        assert picker.labels["dense"].splitlines() == [
            "● dense  each GPU serves a model of its own",
            "    5060ti gemma3-270m · 3060 smollm2-135m · p100 smollm2-135m",
            "    now: nothing to reload"]
        assert picker.labels["gemma"].splitlines()[1:] == [
            "    5060ti gemma3-270m · 3060 gemma3-270m · p100 gemma3-270m",
            "    now: reloads 3060, p100"]
        await pilot.press("down", "enter")  # it opened on the active dense; gemma is next
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        confirm = app.screen
        assert isinstance(confirm, ConfirmSwitch)
        assert confirm.question == "Switch pool to gemma? This reloads 2 engines."  # exact, from the plan
        assert confirm.plan_lines == ["reload 3060: smollm2-135m → gemma3-270m (SOLO)",
                                      "reload p100: smollm2-135m → gemma3-270m (SOLO)",
                                      "unchanged: 5060ti"]
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SwitchProgress))
        view = app.screen
        assert isinstance(view, SwitchProgress)
        admin = app.admin
        await until(pilot, lambda: admin.switched == ["gemma"])  # type: ignore[attr-defined]
        await replay(app, clock, pilot, MID_SWITCH)
        assert view.phase == "running"
        assert view.overall == "switch → gemma: 0/2 engines done · 12s"
        assert view.lines == ["3060  reloading → gemma3-270m  64% · 12s · ETA 6.5s",
                              "p100  reloading → gemma3-270m  31% · 12s · ETA 25s"]
        await replay(app, clock, pilot, 26.0)
        assert view.lines[0] == "3060  done in 16s"
        await replay(app, clock, pilot, AFTER_SWITCH)
        assert view.phase == "done" and view.outcome == "Done: profile gemma is active in 20s."
        assert view.lines == ["3060  done in 16s", "p100  done in 20s"]
        assert view.overall == "2/2 engines done"
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, SwitchProgress))
        assert app.switch_view is None
        assert [cell(app, e, "model") for e in ("3060", "5060ti", "p100")] == ["gemma3-270m"] * 3

    run(app, body)


def test_switch_failure_and_refusal_show_the_reason() -> None:
    admin = FakeAdmin()
    app = make_fake_app(admin)

    async def body(pilot: Pilot[None]) -> None:
        await pilot.press("p", "down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SwitchProgress) and admin.switched == ["gemma"])
        view = app.screen
        assert isinstance(view, SwitchProgress)
        app.post_message(app.PoolEvents([
            ev("profile.start", profile="gemma", previous="dense", engines=["5060ti", "p100"], absent=[], errors={}),
            ev("profile.engine", engine="5060ti", phase="failed", why="profile gemma", model="gemma3-270m",
               error="cudaMalloc failed: out of memory", seconds=2.0),
            ev("profile.engine", engine="p100", phase="done", why="profile gemma", ok=True, seconds=3.0),
            ev("profile.done", profile="gemma", ok=False, seconds=3.1, failed=["5060ti"], absent=[]),
        ]))
        await until(pilot, lambda: view.phase == "failed")
        assert view.outcome == "FAILED in 3.1s: 5060ti: cudaMalloc failed: out of memory"
        assert view.lines == ["5060ti  FAILED in 2.0s: cudaMalloc failed: out of memory", "p100  done in 3.0s"]
        assert "cudaMalloc failed: out of memory" in app.notices[-1][1]
        await pilot.press("escape")
        # refused by the coordinator: the dialog says so, nothing changed
        admin.switch_error = "POST /admin/profile: HTTP 409: a switch to 'dense' is under way"
        await pilot.press("p", "down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SwitchProgress) and app.screen.phase == "refused")
        assert "REFUSED: POST /admin/profile: HTTP 409" in app.screen.outcome

    run(app, body, size=(120, 36))


@pytest.mark.parametrize("key", ["question_mark", "f1"])
def test_help_lists_the_bindings(key: str) -> None:
    app, _ = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await pilot.press(key)
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        listed = " ".join(k for k, _ in KEYS)
        for binding in app.BINDINGS:
            assert binding.key_display or binding.key in listed or binding.key in ("question_mark", "f1")  # type: ignore[union-attr]
        for key_name in ("q", "p", "r", "enter", "esc", "?", "F1", "↑ ↓"):
            assert key_name in listed
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        # from the engine screen too
        await open_engine(app, pilot, "3060")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, EngineScreen))

    run(app, body)


def _inside(app: HydraConsole, selector: str, size: tuple[int, int]) -> bool:
    region = app.screen.query_one(selector).region
    return region.width > 0 and region.height > 0 and region.right <= size[0] and region.bottom <= size[1]


def test_80x24_layout_adapts() -> None:
    app, clock = make_app()
    size = (80, 24)

    async def body(pilot: Pilot[None]) -> None:
        await replay(app, clock, pilot, MID_SWITCH)
        table = app.query_one(EnginesTable)
        assert table.keys == ["engine", "stage", "model", "slots", "decode", "hb"]
        assert app.screen.has_class("-narrow") and app.screen.has_class("-short")
        assert not app.query_one(ProfilesPanel).display or app.query_one(ProfilesPanel).region.width == 0
        for selector in ("#engines", "#detail", "#loads", "#routes", "#events"):
            assert _inside(app, selector, size), selector
        assert table.virtual_size.width <= table.region.width  # no sideways scrolling of the engines
        loads = app.query_one(LoadsPanel)
        assert _inside(app, "#switch", size)
        assert all(bar.region.bottom <= size[1] for bar in loads.bars.values())
        # the engine screen: slots, events and parameters all on screen
        await open_engine(app, pilot, "5060ti")
        for selector in ("#summary", "#slots-box", "#events", "#params-box", "#params"):
            assert _inside(app, selector, size), selector
        await pilot.press("escape")
        # dialogs fit
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert _inside(app, "#help", size)
        await pilot.press("escape")
        # widening the terminal brings the columns and the Profiles pane back
        await pilot.resize_terminal(140, 40)
        await until(pilot, lambda: len(table.keys) == 10)
        await until(pilot, lambda: app.query_one(ProfilesPanel).region.width > 0)

    run(app, body, size=size)


def test_80x24_switch_dialogs_fit() -> None:
    app, clock = make_app()
    size = (80, 24)

    async def body(pilot: Pilot[None]) -> None:
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        assert _inside(app, "#profiles", size)
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        for selector in ("#question", "#plan", "#yes", "#no"):
            assert _inside(app, selector, size), selector
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SwitchProgress))
        await replay(app, clock, pilot, MID_SWITCH)
        for selector in ("#overall", "#engines"):
            assert _inside(app, selector, size), selector

    run(app, body, size=size)


def _colours(svg: str) -> set[str]:
    return {c.lower() for c in re.findall(r"fill(?:=\"|: )#([0-9a-fA-F]{6})", svg)} - SVG_CHROME


def test_no_color_conveys_state_in_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        assert app.no_color
        await replay(app, clock, pilot, MID_SWITCH)
        clock.t += 7.0  # the heartbeats are now stale
        app.post_message(app.PoolEvents([ev("engine.down", engine="p100", reason="no heartbeat for 3.2 s")]))
        await until(pilot, lambda: not app.pool.engines["p100"].alive)
        await pilot.pause(0.1)
        svg = app.export_screenshot()
        colours = _colours(svg)
        assert colours and all(c[0:2] == c[2:4] == c[4:6] for c in colours), colours  # shades of grey only
        text = re.sub(r"&#160;", " ", svg)
        assert cell(app, "p100", "stage") == "DEAD"
        assert cell(app, "5060ti", "stage") == "ready"
        assert cell(app, "3060", "stage") == "reloading 64%"
        assert cell(app, "5060ti", "hb").endswith("!")  # stale, in text
        assert cell(app, "p100", "hb").endswith("s")  # a dead engine's age is not flagged twice
        for word in ("DEAD", "ready", "reloading", "ETA"):
            assert word in text, word

    run(app, body, size=(80, 24))


def test_no_color_snapshot_of_the_switch_dialogs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app, _ = make_app()

    async def body(pilot: Pilot[None]) -> None:
        await pilot.press("p", "down", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSwitch))
        colours = _colours(app.export_screenshot())
        assert all(c[0:2] == c[2:4] == c[4:6] for c in colours), colours

    run(app, body, size=(80, 24))


def test_a_pool_update_before_the_engine_screen_is_mounted_is_kept_for_the_mount() -> None:
    """The app re-renders the engine screen on every event; one can arrive between the screen's push and
    its mount, before its tables have columns (a CI run's console test once failed on exactly that)."""
    from tui.model import EngineRow, PoolModel
    from tui.widgets import EngineDetails

    pool = PoolModel()
    pool.engines["gpu0"] = EngineRow("gpu0", slots_total=2, slots_busy=1)
    screen = EngineScreen("gpu0", PoolModel(), lambda _name: EngineDetails(None))
    app = make_fake_app()

    async def main() -> None:
        async with app.run_test(size=(132, 36)) as pilot:
            await until(pilot, lambda: app.snapshots >= 1)  # the app's own first snapshot is in
            screen.show(pool)  # before the mount: kept, not drawn
            assert screen.pool is pool and screen.slot_rows == []
            await app.push_screen(screen)
            await until(pilot, lambda: screen.slot_rows != [])
            assert screen.slot_rows == [("0", "busy", "-", "-", "-"), ("1", "idle", "-", "-", "-")]

    asyncio.run(main())


def _option_rows(picker: ProfilePicker) -> dict[str, set[str]]:
    """Each profile's first rendered line in the chooser → the background colours it is drawn with."""
    from textual.widgets import OptionList

    ol = picker.query_one(OptionList)
    rows: dict[str, set[str]] = {}
    for y in range(ol.size.height):
        strip = ol.render_line(y)
        words = strip.text.split()
        if len(words) >= 2 and words[0] == "●" and words[1] in picker.profiles:
            rows.setdefault(words[1], {str(s.style.bgcolor) for s in strip if s.style})
        elif words and words[0] in picker.profiles:
            rows.setdefault(words[0], {str(s.style.bgcolor) for s in strip if s.style})
    return rows


def test_profile_chooser_opens_on_the_active_profile_drawn_highlighted() -> None:
    """p: the chooser opens with the active profile highlighted (drawn so, not only set), and one
    down moves to the next profile, one up back: no key is lost to a list without a highlight."""
    from textual.widgets import OptionList

    app, clock = make_app()

    async def body(pilot: Pilot[None]) -> None:
        assert app.pool.profile.active == "dense"
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
        picker = app.screen
        assert isinstance(picker, ProfilePicker)
        ol = picker.query_one(OptionList)
        await pilot.pause()
        assert ol.has_focus
        assert ol.highlighted_option is not None and ol.highlighted_option.id == "dense"
        rows = _option_rows(picker)
        assert set(rows) == {"dense", "gemma"}
        assert rows["dense"] != rows["gemma"], rows  # the highlight is on screen, on the active row
        await pilot.press("down")
        assert ol.highlighted_option is not None and ol.highlighted_option.id == "gemma"
        rows_after = _option_rows(picker)
        assert rows_after["gemma"] == rows["dense"] and rows_after["dense"] == rows["gemma"]
        await pilot.press("up")
        assert ol.highlighted_option is not None and ol.highlighted_option.id == "dense"
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProfilePicker))

    run(app, body)


@pytest.mark.parametrize(("active", "opens_on", "after_down"),
                         [("b", "b", "c"), ("c", "c", "a"), (None, "a", "b"), ("gone", "a", "b")])
def test_profile_chooser_highlight_follows_the_active_profile(active: str | None, opens_on: str,
                                                             after_down: str) -> None:
    """Wherever the active profile sits in the list (last: down wraps to the first; none known; one the
    list lacks)."""
    from textual.app import App
    from textual.widgets import OptionList

    class One(App[None]):
        def on_mount(self) -> None:
            self.push_screen(ProfilePicker({"a": "first", "b": "", "c": "last"}, active))

    async def main() -> None:
        app = One()
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ProfilePicker))
            await pilot.pause()
            ol = app.screen.query_one(OptionList)
            assert ol.highlighted_option is not None and ol.highlighted_option.id == opens_on
            await pilot.press("down")
            assert ol.highlighted_option is not None and ol.highlighted_option.id == after_down

    asyncio.run(main())

"""SVG snapshot of the console with a known pool (the admin HTTP client is the unit tests' fake).

Update after an intended change of the layout with ``pytest tests/unit/tui/test_snapshot.py
--snapshot-update`` and look at the new SVG under ``__snapshots__/`` before committing it.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from tests.unit.tui.test_app import FakeAdmin, engine_doc, ev, make_app, until
from tests.unit.tui.test_app import until as until_

pytest.importorskip("pytest_textual_snapshot",
                    reason="pytest-textual-snapshot is not installed (pip install -e '.[test]')")


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Event times are shown in local time; pin it."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_console_snapshot(snap_compare: Any, utc: None) -> None:
    admin = FakeAdmin()
    for item in admin.engines_answer["engines"]:
        item["up_since"] = None  # "up 3d" would move with the wall clock
    admin.engines_answer["engines"].append(engine_doc(
        "3060", gpu={"name": "CUDA0", "description": "NVIDIA GeForce RTX 3060", "kind": "gpu", "arch": "sm_86",
                     "vram_total": 12 << 30, "vram_free": 11 << 30},
        stage="ready", model="smollm2-135m", slots_busy=3, slots_total=4, queued=2, up_since=None, last_seen_s=1.7))
    app = make_app(admin)

    async def run_before(pilot: Any) -> None:
        await until(pilot, lambda: app.snapshots >= 1)
        app.post_message(app.PoolEvents([
            ev("engine.down", engine="p100", reason="no heartbeat for 3.1 s (3 intervals of 1 s)"),
            ev("engine.stage", engine="5060ti", stage="reloading", previous="ready", model="smollm2-135m",
               loading_model="gemma3-270m"),
            ev("engine.progress", engine="5060ti", stage="reloading", progress=0.42, loading_model="gemma3-270m"),
            ev("route", req="req-1", engine="3060", model="smollm2-135m", step="affinity",
               reason="session s1 is warm on 3060"),
            ev("route", req="req-2", engine=None, model="qwen", step="none", reason="no engine serves qwen"),
        ]))
        await until(pilot, lambda: "5060ti" in app.loads.bars)
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


# ----- the recorded pool (tests/data/console-stream.json): three GPU engines, a switch dense → gemma ---------


def _replayed(until: float, keys: tuple[tuple[str, type | None], ...] = (), after: float | None = None) -> tuple[Any, Any]:
    """The recorded pool replayed to ``until`` s; each key pressed, then the screen it brings up
    awaited (with its data); then replayed on to ``after`` s."""
    from tests.support.console_replay import make_app as replay_app, replay, started
    from tui.widgets import EngineScreen

    app, clock = replay_app()

    async def run_before(pilot: Any) -> None:
        await started(app, pilot)
        await replay(app, clock, pilot, until)
        for key, shows in keys:
            await pilot.press(key)
            if shows is not None:
                await until_(pilot, lambda: isinstance(app.screen, shows))
            if isinstance(app.screen, EngineScreen):
                screen = app.screen
                await until_(pilot, lambda: screen.fetches >= 1)
            await pilot.pause(0.05)
        if after is not None:
            await replay(app, clock, pilot, after)
        await pilot.pause(0.3)

    return app, run_before


def test_snapshot_main_screen_mid_switch(snap_compare: Any, utc: None) -> None:
    """The README's picture: loads with ETA, the switch's progress, routing decisions."""
    app, run_before = _replayed(21.5)
    assert snap_compare(app, terminal_size=(132, 36), run_before=run_before)


def test_snapshot_main_screen_80x24(snap_compare: Any, utc: None) -> None:
    app, run_before = _replayed(21.5)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_snapshot_engine_screen(snap_compare: Any, utc: None) -> None:
    """Enter on 5060ti: its slots (two busy, with tok/s), its parameters with source and tier, its events."""
    from tui.widgets import EngineScreen

    app, run_before = _replayed(21.5, keys=(("down", None), ("enter", EngineScreen)))
    assert snap_compare(app, terminal_size=(132, 36), run_before=run_before)


def test_snapshot_switch_confirmation(snap_compare: Any, utc: None) -> None:
    """p, down, enter: the exact plan of a switch to gemma."""
    from tui.widgets import ConfirmSwitch, ProfilePicker

    app, run_before = _replayed(8.0, keys=(("p", ProfilePicker), ("down", None), ("enter", ConfirmSwitch)))
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_snapshot_switch_progress(snap_compare: Any, utc: None) -> None:
    """y: the switch's own dialog, each engine's load with its ETA."""
    from tui.widgets import ConfirmSwitch, ProfilePicker, SwitchProgress

    app, run_before = _replayed(8.0, keys=(("p", ProfilePicker), ("down", None), ("enter", ConfirmSwitch), ("y", SwitchProgress)),
                                after=21.5)
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_readme_screenshot_is_current(tmp_path: Any) -> None:
    """docs/console-main.svg is what scripts/console_screenshot.py renders now (run it after a layout change)."""
    import subprocess
    import sys

    from tests.support.engine import REPO

    out = tmp_path / "console-main.svg"
    subprocess.run([sys.executable, str(REPO / "scripts" / "console_screenshot.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=120)
    assert out.read_text() == (REPO / "docs" / "console-main.svg").read_text(), \
        "docs/console-main.svg is stale: run scripts/console_screenshot.py"
    assert "](docs/console-main.svg)" in (REPO / "README.md").read_text()

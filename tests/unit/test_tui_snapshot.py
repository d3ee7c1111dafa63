"""SVG snapshot of the console with a known pool (the admin HTTP client is the unit tests' fake).

Update after an intended change of the layout with ``pytest tests/unit/test_tui_snapshot.py
--snapshot-update`` and look at the new SVG under ``__snapshots__/`` before committing it.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from tests.unit.test_tui_app import FakeAdmin, engine_doc, ev, make_app, until

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

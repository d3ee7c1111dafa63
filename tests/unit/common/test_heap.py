"""hydrad.common.heap: what a full collector pass walks on a daemon, and the benchmarks' pause.

Freezing changes the whole interpreter, so the daemon-side checks run in a fresh Python each
(a subprocess), never in the test runner's own."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hydrad.common import heap

REPO = Path(__file__).resolve().parents[3]


def _python(code: str, timeout: float = 120) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_settled_daemon_leaves_a_full_pass_almost_nothing_to_walk() -> None:
    got = _python("""
        import gc, json
        import hydrad.cli.hydrad, hydrad.coordinator.daemon  # everything both daemons import
        before = len(gc.get_objects(generation=2))
        from hydrad.common import heap
        heap.settle()
        print(json.dumps({"before": before, "after": len(gc.get_objects(generation=2)), "frozen": gc.get_freeze_count()}))
    """)
    assert got["before"] > 10_000, got  # the daemons' imports alone: what a pass walked before
    assert got["frozen"] >= got["before"], got
    assert got["after"] < 100, got


@pytest.mark.model
def test_a_loaded_model_is_settled_too(smollm_path: Path) -> None:
    """A load's objects (the generation's Python side, the tokenizer tables) are frozen once it is
    installed; the objects made after it are what a full pass walks."""
    got = _python(f"""
        import asyncio, gc, json, threading, time
        from pathlib import Path
        from hydrad.common import heap
        from hydrad.common.registry import Registry
        from hydrad.engine.control import EngineControl
        from hydrad.engine.core import EngineCore
        heap.settle()
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        core = EngineCore()
        core.start(loop)
        control = EngineControl(core, Registry(Path({str(smollm_path.parent)!r})), {{"n_threads": 1, "n_ctx": 512}})
        frozen = gc.get_freeze_count()
        asyncio.run_coroutine_threadsafe(control.configure({{"model": {smollm_path.name!r}}}), loop).result(60)
        deadline = time.monotonic() + 60
        while core.current_load is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        print(json.dumps({{"grew": gc.get_freeze_count() - frozen, "gen2": len(gc.get_objects(generation=2)),
                          "serving": core.gen is not None}}))
        core.stop()
    """)
    assert got["serving"], got
    assert got["grew"] > 1_000, got
    assert got["gen2"] < 1_000, got


def test_settling_does_not_walk_what_is_already_frozen() -> None:
    """A reload settles the heap while the serving generation's step thread waits for the interpreter
    lock, so settling must not take longer as the frozen heap grows: with a million objects frozen,
    counting them takes milliseconds, settling again microseconds."""
    got = _python("""
        import gc, json, time
        from hydrad.common import heap
        keep = [[i] for i in range(1_000_000)]
        heap.settle()
        t0 = time.perf_counter(); n = gc.get_freeze_count(); count_s = time.perf_counter() - t0
        times = []
        for _ in range(5):
            keep.append([0])
            t0 = time.perf_counter(); heap.settle(); times.append(time.perf_counter() - t0)
        print(json.dumps({"frozen": n, "count_s": count_s, "settle_s": sorted(times)[2]}))
    """)
    assert got["frozen"] >= 1_000_000, got
    assert got["settle_s"] * 20 < got["count_s"], got  # measured: about 1,000 times shorter


def test_paused_runs_a_pass_first_and_none_inside() -> None:
    full = gc.get_stats()[2]["collections"]
    assert gc.isenabled()
    with heap.paused():
        assert gc.get_stats()[2]["collections"] == full + 1
        assert not gc.isenabled()
    assert gc.isenabled()


def test_paused_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with heap.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()

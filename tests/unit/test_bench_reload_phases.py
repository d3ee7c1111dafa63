"""scripts/bench_reload.py: placing a switch's longest gap in the switch's own phases or its quiet rest.

A switch's window (about two seconds) also holds whatever stall the host puts into any window that
long. The bench splits it: gaps that overlap a part of the load, the new generation's first turns or a
part of the old one's free are the switch's own; the longest of the rest is quiet. The free's parts are
read back from the engine's own log line, written here by the real reaper through the real formatter.
"""

from __future__ import annotations

import io
import logging
import time

import pytest

from hydrad.common.logs import LogfmtFormatter
from hydrad.engine.reaper import Reaper
from tests.support.scripts import load_script

br = load_script("bench_reload")


def test_a_gap_over_a_phase_is_the_switchs_own_and_the_rest_is_quiet() -> None:
    ends = [0.02, 0.04, 0.06, 0.13, 0.15, 0.17, 0.25, 0.27]  # a 70 ms gap in a phase, an 80 ms one outside
    split = br.gaps_by_phase(ends, 0.0, 0.30, [("context", 0.07, 0.09)])
    assert split["own_gap_s"] == pytest.approx(0.07) and split["own_phases"] == ["context"]
    assert split["own_from_s"] == pytest.approx(0.06)
    assert split["quiet_gap_s"] == pytest.approx(0.08) and split["quiet_from_s"] == pytest.approx(0.17)
    # no phase at all: every gap is quiet, and nothing is the switch's own
    bare = br.gaps_by_phase(ends, 0.0, 0.30, [])
    assert bare["own_gap_s"] == 0.0 and bare["own_phases"] == [] and bare["quiet_gap_s"] == pytest.approx(0.08)


def test_the_loads_parts_follow_each_other_back_from_the_install() -> None:
    phases = br.load_phases(10.0, {"model_s": 0.3, "context_s": 0.05, "warmup_s": 0.02, "install_s": 0.01,
                                   "load_s": 0.37})
    at = {name: (a, b) for name, a, b in phases}
    assert at["install"] == pytest.approx((9.99, 10.0))
    assert at["warm-up"] == pytest.approx((9.97, 9.99))
    assert at["context"] == pytest.approx((9.92, 9.97))
    assert at["weights"] == pytest.approx((9.62, 9.92))
    assert at["first turns"] == pytest.approx((10.0, 10.0 + br.FIRST_TURNS_S))


class _Retired:
    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def free_parts(self) -> list[tuple[str, object]]:
        def context() -> None:
            self.at["context"] = time.time()
            time.sleep(0.03)

        def model() -> None:
            self.at["model"] = time.time()
            time.sleep(0.02)

        return [("context", context), ("model", model)]


@pytest.mark.serial  # the parts are placed to 20 ms: alone
def test_the_frees_parts_are_placed_from_the_engines_log_line() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogfmtFormatter())
    engine_log = logging.getLogger("hydrad.engine")
    engine_log.addHandler(handler)
    old_level = engine_log.level
    engine_log.setLevel(logging.INFO)
    try:
        gen = _Retired()
        reaper = Reaper(pause_s=0.2)
        reaper.bury(gen, "fp", "its last request ended")
        deadline = time.monotonic() + 10
        while reaper.freed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine_log.removeHandler(handler)
        engine_log.setLevel(old_level)
    text = out.getvalue()
    assert "generation retired" in text, text
    phases = {name: (a, b) for name, a, b in br.free_phases(text, 0.0)}  # wall clock kept (offset 0)
    assert set(phases) == {"free context", "free model"}
    # each part starts where the reaper started it (the log's stamp has millisecond resolution, and a busy
    # machine may delay the line a little); the parts are 30 and 20 ms long, 200 ms apart
    assert phases["free context"][0] == pytest.approx(gen.at["context"], abs=0.02)
    assert phases["free model"][0] == pytest.approx(gen.at["model"], abs=0.02)
    assert phases["free model"][0] - phases["free context"][0] >= 0.2
    took = phases["free model"][1] - phases["free model"][0] - br.FREE_TAIL_S
    assert 0.02 <= took < 0.1


class _Served:
    """What a bench client keeps of each answer: its ``timings`` by the time it ended."""

    def __init__(self, served: dict[float, dict]) -> None:
        self.served = served


def test_a_gap_made_outside_the_handler_is_taken_out_of_the_engines_gap() -> None:
    # four 20 ms requests one after another, the engine holding each 18 ms (2 ms outside, steady);
    # the third took 45 ms of which 25 outside the handler: the HTTP layer, the network or the client
    log = [(0.000, 0.020, 200), (0.020, 0.040, 200), (0.040, 0.085, 200), (0.085, 0.105, 200)]
    client = _Served({0.020: {"server_ms": 18.0}, 0.040: {"server_ms": 18.0}, 0.085: {"server_ms": 20.0},
                      0.105: {"server_ms": 18.0}})
    assert br.outside_ms(client, log[2]) == pytest.approx(25.0)
    assert br.longest_gap(log, 0.0, 0.105)[1] == pytest.approx(0.045)
    assert br.server_gap(client, log, 0.0, 0.105, base_ms=2.0) == pytest.approx(0.022)  # 45 less 23 beyond steady
    # the engine's own stall stays: there the handler held the request as long as the client waited
    slow = [(0.000, 0.020, 200), (0.020, 0.060, 200)]
    held = _Served({0.020: {"server_ms": 18.0}, 0.060: {"server_ms": 38.0}})
    assert br.server_gap(held, slow, 0.0, 0.060, base_ms=2.0) == pytest.approx(0.040)
    # an answer without timings (a failure, an older engine) is taken as the client saw it
    assert br.server_gap(_Served({}), slow, 0.0, 0.060, base_ms=2.0) == pytest.approx(0.040)


def _hold(seconds: float) -> None:
    time.sleep(seconds)  # blocks the event loop on purpose


def test_a_held_event_loop_is_placed_from_the_engines_log_line() -> None:
    """The loop watch's line, written by the real watch through the real formatter, read back: when the
    loop was held (wall clock here), for how long and where."""
    import asyncio

    from hydrad.common.loopwatch import LoopWatch

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogfmtFormatter())
    log = logging.getLogger("test.bench_reload.loop")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    held_at: list[float] = []

    async def main() -> None:
        watch = LoopWatch(asyncio.get_running_loop(), 0.02, log)
        watch.start()
        await asyncio.sleep(0.1)
        held_at.append(time.time())
        _hold(0.12)
        await asyncio.sleep(0.1)
        watch.stop()

    try:
        asyncio.run(main())
    finally:
        log.removeHandler(handler)
    holds = [h for h in br.loop_holds(out.getvalue(), 0.0) if h[1] - h[0] >= 0.1]
    assert holds, out.getvalue()
    start, end, where = holds[0]
    # the watch noticed within one check (20 ms) of the hold's start; the line's stamp has ms resolution
    assert held_at[0] - 0.05 <= start <= held_at[0] + 0.03
    assert end == pytest.approx(held_at[0] + 0.12, abs=0.05)
    assert "_hold" in where and "test_bench_reload_phases.py" in where

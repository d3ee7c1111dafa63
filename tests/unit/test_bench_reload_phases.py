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

"""PoolModel: admin snapshots and PUB events merged into what the console shows (no terminal)."""

from __future__ import annotations

from tests.unit.tui.test_app import GIB, engine_doc, engines_doc, profile_doc
from tui.model import EngineRow, PoolModel, switch_reasons
from tui.format import describe_event, fmt_age, fmt_gpu, fmt_load, fmt_secs, fmt_switch, fmt_vram


def state(now: list[float] | None = None) -> PoolModel:
    clock = now or [100.0]
    s = PoolModel(clock=lambda: clock[0])
    s.apply_engines(engines_doc())
    s.apply_profile(profile_doc())
    return s


def test_snapshot_rows() -> None:
    s = state()
    assert [r.name for r in s.sorted_engines()] == ["5060ti", "p100"]
    r = s.engines["5060ti"]
    assert (r.stage, r.model, r.slots_busy, r.slots_total, r.decode_tps) == ("ready", "smollm2-135m", 1, 4, 95.4)
    assert r.vram_used == 4 * GIB and fmt_vram(r) == "4.0G/16.0G"
    assert round(s.heartbeat_age(r) or 0, 6) == 0.3
    assert s.profile.active == "dense" and list(s.profile.profiles) == ["dense", "gemma"]


def test_a_failed_configure_is_kept_for_the_detail_pane() -> None:
    from tui.widgets.detail import render_detail

    s = PoolModel()
    s.apply_engines({"engines": [engine_doc("a", last_configure={
        "engine": "a", "ok": False, "why": "profile gemma", "model": "gemma3-270m", "error": "out of memory"})]})
    assert "profile gemma → gemma3-270m failed: out of memory" in render_detail(s, s.engines["a"]).plain
    s.apply_engines({"engines": [engine_doc("a", last_configure=None)]})
    assert s.engines["a"].last_configure is None


def test_engines_missing_from_a_snapshot_are_dropped() -> None:
    s = state()
    s.apply_engines({"engines": [engine_doc("p100")]})
    assert list(s.engines) == ["p100"]


def test_heartbeat_age_moves_with_the_clock_and_events_reset_it() -> None:
    now = [100.0]
    s = state(now)
    now[0] = 104.3
    assert round(s.heartbeat_age(s.engines["5060ti"]), 1) == 4.6
    s.apply_event("engine.progress", {"engine": "5060ti", "stage": "reloading", "progress": 0.5})
    assert s.heartbeat_age(s.engines["5060ti"]) == 0.0


def test_down_and_up() -> None:
    s = state()
    assert s.apply_event("engine.down", {"engine": "p100", "reason": "no heartbeat for 3.1 s"}) == {"engines"}
    r = s.engines["p100"]
    assert not r.alive and r.down_reason == "no heartbeat for 3.1 s" and not r.loading
    s.apply_event("engine.up", {"engine": "p100", "stage": "idle", "model": None, "gpu": {"name": "CPU"}})
    assert r.alive and r.down_reason is None and r.stage == "idle" and r.model is None


def test_unknown_engine_from_an_event_gets_a_row() -> None:
    s = state()
    s.apply_event("engine.stage", {"engine": "new", "stage": "loading_model", "model": None,
                                   "loading_model": "gemma3-270m"})
    assert s.engines["new"].loading and s.engines["new"].loading_model == "gemma3-270m"


def test_progress_clears_when_the_load_ends() -> None:
    s = state()
    s.apply_event("engine.progress", {"engine": "5060ti", "stage": "reloading", "progress": 0.7,
                                      "loading_model": "gemma3-270m"})
    r = s.engines["5060ti"]
    assert r.loading and r.progress == 0.7
    s.apply_event("engine.stage", {"engine": "5060ti", "stage": "ready", "model": "gemma3-270m"})
    assert not r.loading and r.progress is None and r.model == "gemma3-270m"


def test_profile_events() -> None:
    s = state()
    s.apply_event("profile.start", {"profile": "gemma", "previous": "dense", "engines": ["5060ti"], "absent": []})
    assert s.profile.state == "switching" and s.profile.active == "gemma" and s.profile.switch_engines == ["5060ti"]
    s.apply_event("profile.engine", {"engine": "5060ti", "phase": "configuring", "why": "profile gemma",
                                     "model": "gemma3-270m"})
    assert s.engines["5060ti"].configuring == "profile gemma"
    s.apply_event("profile.engine", {"engine": "5060ti", "phase": "failed", "error": "out of memory"})
    assert s.engines["5060ti"].configuring is None and s.engines["5060ti"].last_error == "out of memory"
    s.apply_event("profile.done", {"profile": "gemma", "ok": False, "seconds": 1.5, "failed": ["5060ti"]})
    assert s.profile.state == "steady" and s.profile.last_switch == {
        "profile": "gemma", "ok": False, "seconds": 1.5, "failed": ["5060ti"], "absent": None,
        "reasons": {"5060ti": "out of memory"}}


def test_routes_are_bounded() -> None:
    s = PoolModel(route_log_size=3)
    for i in range(5):
        s.apply_event("route", {"req": f"r{i}", "engine": "a", "step": "cost", "reason": "cheapest"}, ts=1.0)
    assert [r.req for r in s.routes] == ["r2", "r3", "r4"]


COMBINE_PROFILE = {"model": "gemma3-270m", "mode": "COMBINE", "peer": "p100"}


def test_mode_labels_are_what_the_engines_report_not_the_profile() -> None:
    s = PoolModel()
    s.apply_engines({"engines": [
        engine_doc("5060ti", mode="combine", role="head", peers=["10.0.0.2:50052"], pair_peers=["p100"],
                   pair_heads=[], pair=["p100"]),
        engine_doc("p100", model=None, mode="combine", role="peer", serving=["10.0.0.1:41234"], pair_peers=[],
                   pair_heads=["5060ti"], pair=["5060ti"]),
        engine_doc("3060"),
        engine_doc("both", mode="combine", role="head+peer", pair_peers=["p100"], pair_heads=["5060ti"])]})
    # the active profile says otherwise for 3060; the engines' own reports win
    s.apply_profile({"active": "combine", "profiles": {"combine": ""}, "engines": {
        "5060ti": {"entry": COMBINE_PROFILE}, "p100": {"entry": {"mode": "PEER"}},
        "3060": {"entry": {"model": "smollm2-135m", "mode": "COMBINE", "peer": "p100"}}}})
    assert s.mode_label(s.engines["5060ti"]) == "COMBINE head→p100"
    assert s.mode_label(s.engines["p100"]) == "COMBINE peer←5060ti"
    assert s.mode_label(s.engines["3060"]) == "SOLO"
    assert s.mode_label(s.engines["both"]) == "COMBINE head→p100 peer←5060ti"


def test_mode_label_without_names_shows_the_engines_addresses() -> None:
    """A coordinator that names no pair: the endpoints the engines report."""
    s = PoolModel()
    s.apply_engines({"engines": [
        engine_doc("5060ti", mode="combine", role="head", peers=["10.0.0.2:50052"]),
        engine_doc("p100", model=None, mode="combine", role="peer", serving=["10.0.0.1:41234"])]})
    assert s.mode_label(s.engines["5060ti"]) == "COMBINE head→10.0.0.2:50052"
    assert s.mode_label(s.engines["p100"]) == "COMBINE peer←10.0.0.1:41234"


def test_mode_label_shows_the_switch_target_until_the_engine_reports_it() -> None:
    s = PoolModel()
    s.apply_engines({"engines": [engine_doc("5060ti"), engine_doc("p100", model=None), engine_doc("3060")]})
    s.apply_profile({"active": "dense", "profiles": {"dense": "", "combine": ""}, "engines": {},
                     "plans": {"combine": {"engines": {"5060ti": COMBINE_PROFILE,
                                                       "p100": {"model": None, "mode": "PEER", "peer": None},
                                                       "3060": {"model": "gemma3-270m", "mode": "SOLO"}}}}})
    s.apply_event("profile.start", {"profile": "combine", "previous": "dense", "engines": ["5060ti", "p100", "3060"]})
    assert s.mode_label(s.engines["5060ti"]) == "SOLO → COMBINE+p100"
    assert s.mode_label(s.engines["p100"]) == "SOLO → PEER"
    assert s.mode_label(s.engines["3060"]) == "SOLO"  # SOLO to SOLO: nothing to announce
    # the peer's configure is done (a PEER loads nothing); it lends nothing until the head loads
    s.apply_event("profile.engine", {"engine": "p100", "phase": "done"})
    assert s.mode_label(s.engines["p100"]) == "SOLO"
    # the head's heartbeat reports the pair before its configure is done: the report is the value
    s.apply_engines({"engines": [
        engine_doc("5060ti", mode="combine", role="head", pair_peers=["p100"], pair_heads=[]),
        engine_doc("p100", model=None, mode="combine", role="peer", pair_peers=[], pair_heads=["5060ti"]),
        engine_doc("3060")]})
    assert s.mode_label(s.engines["5060ti"]) == "COMBINE head→p100"
    assert s.mode_label(s.engines["p100"]) == "COMBINE peer←5060ti"
    s.apply_event("profile.done", {"profile": "combine", "ok": True})
    assert s.mode_label(s.engines["5060ti"]) == "COMBINE head→p100"


def test_reload_estimate() -> None:
    s = state()
    assert s.reload_estimate("gemma") == (["5060ti", "p100"], False)  # another profile: an upper bound
    assert s.reload_estimate("dense") == ([], True)  # the active one, every engine matching it
    s.engines["p100"].model = "smollm2-135m"
    assert s.reload_estimate("dense") == (["p100"], True)
    s.apply_event("engine.down", {"engine": "5060ti", "reason": "left"})
    assert s.reload_estimate("gemma") == (["p100"], False)


def test_formatting() -> None:
    assert fmt_gpu(EngineRow("x", gpu={"name": "CPU", "arch": "cpu"})) == "CPU"
    assert fmt_gpu(EngineRow("x", gpu={"name": "CUDA0", "description": "NVIDIA H200", "arch": "sm_90"})) == "H200 sm_90"
    assert fmt_vram(EngineRow("x", gpu={"vram_total": 0})) == "-"
    assert fmt_vram(EngineRow("x", gpu={"vram_total": 8 * GIB}, vram_free=7 * GIB + (512 << 20))) == "512M/8.0G"
    assert [fmt_age(a) for a in (None, 0.25, 42, 600, 9000)] == ["-", "0.2s", "42s", "10m", "2h"]
    assert describe_event("engine.down", {"engine": "a", "reason": "disconnected"}) == "a DOWN: disconnected"
    assert describe_event("profile.done", {"profile": "p", "ok": True, "seconds": 2.0}) == "profile p done in 2.0 s"
    assert describe_event("session.moved", {"session": "s1", "dst": "b", "slot": 2, "tokens": 900, "seconds": 0.012}) \
        == "session s1 moved to b (slot 2, 900 tokens) in 12 ms"
    assert describe_event("session.restored", {"session": "s1", "engine": "a", "slot": 0, "tokens": 10}) \
        == "session s1 restored from the store on a (slot 0, 10 tokens)"
    assert describe_event("split", {"req": "cmpl-1", "ok": True, "prefill": "fast", "decode": "slow", "tokens": 900,
                                    "measured_prefill_s": 0.5, "measured_transfer_s": 0.02, "total_s": 1.2,
                                    "single_s": 3.4, "single": "slow"}) \
        == ("cmpl-1 split: fast prefilled 900 tokens, slow decodes: prefill 500 ms, transfer 20 ms "
            "(planned 1.2 s against 3.4 s on slow)")
    assert describe_event("split", {"req": "cmpl-2", "ok": False, "prefill": "fast", "decode": "slow",
                                    "error": "no idle slot"}) \
        == "cmpl-2 split fast → slow abandoned (no idle slot); slow prefills"
    assert describe_event("engine.progress", {"engine": "a", "stage": "reloading", "progress": 0.5,
                                              "loading_model": "m"}) == "a reloading m 50%"


def test_load_timing_elapsed_and_eta() -> None:
    now = [100.0]
    s = state(now)
    s.apply_event("profile.start", {"profile": "gemma", "previous": "dense", "engines": ["5060ti", "p100"]})
    s.apply_event("profile.engine", {"engine": "5060ti", "phase": "configuring", "why": "profile gemma",
                                     "model": "gemma3-270m"})
    r = s.engines["5060ti"]
    assert r.in_load and r.phase == "configuring" and s.load_elapsed(r) == 0.0 and s.load_eta(r) is None
    now[0] = 101.0
    s.apply_event("engine.stage", {"engine": "5060ti", "stage": "reloading", "model": "smollm2-135m",
                                   "loading_model": "gemma3-270m"})
    s.apply_event("engine.progress", {"engine": "5060ti", "stage": "reloading", "progress": 0.1})
    assert r.phase == "reloading" and s.load_eta(r) is None  # one sample: no rate yet
    now[0] = 105.0
    s.apply_event("engine.progress", {"engine": "5060ti", "stage": "reloading", "progress": 0.5})
    # 0.4 in 4 s: the remaining 0.5 takes 5 s
    assert s.load_elapsed(r) == 5.0 and s.load_eta(r) == 5.0
    now[0] = 107.0  # no news for 2 s: the estimate counts down
    assert s.load_eta(r) == 3.0
    assert fmt_load(s, r) == "50% · 7.0s · ETA 3.0s"
    assert fmt_switch(s) == "switch → gemma: 0/2 engines done · 7.0s"
    # the engine finishes; its part of the switch is done
    s.apply_event("engine.stage", {"engine": "5060ti", "stage": "ready", "model": "gemma3-270m"})
    s.apply_event("profile.engine", {"engine": "5060ti", "phase": "done", "why": "profile gemma", "ok": True,
                                     "seconds": 7.0})
    assert not r.in_load and r.load_started is None and s.load_eta(r) is None
    assert s.profile.progress() == (1, 2)
    assert fmt_switch(s) == "switch → gemma: 1/2 engines done · 7.0s"
    s.apply_event("profile.engine", {"engine": "p100", "phase": "failed", "why": "profile gemma",
                                     "error": "out of memory"})
    assert fmt_switch(s) == "switch → gemma: 2/2 engines done (1 FAILED) · 7.0s"
    s.apply_event("profile.done", {"profile": "gemma", "ok": False, "seconds": 7.5, "failed": ["p100"]})
    assert fmt_switch(s) is None
    assert switch_reasons(s.profile.last_switch) == {"p100": "out of memory"}


def test_a_new_load_restarts_the_rate() -> None:
    now = [0.0]
    s = state(now)
    s.apply_event("engine.progress", {"engine": "p100", "stage": "loading_model", "progress": 0.8})
    now[0] = 2.0
    s.apply_event("engine.progress", {"engine": "p100", "stage": "loading_model", "progress": 0.9})
    r = s.engines["p100"]
    assert round(s.load_eta(r) or 0, 6) == 2.0
    now[0] = 3.0
    s.apply_event("engine.progress", {"engine": "p100", "stage": "loading_model", "progress": 0.1})  # a new load
    assert s.load_eta(r) is None and r.load_first == (3.0, 0.1)


def test_plans_make_the_reload_estimate_exact() -> None:
    s = state()
    assert s.reload_estimate("gemma") == (["5060ti", "p100"], False)  # no plans: every live engine, at most
    doc = profile_doc()
    doc["plans"] = {"gemma": {"description": "", "engines": {}, "reload": {"5060ti": {"from": "smollm2-135m",
                                                                                     "to": "gemma3-270m"}},
                              "unchanged": ["p100"], "absent": [], "errors": {}}}
    s.apply_profile(doc)
    assert s.reload_estimate("gemma") == (["5060ti"], True)


def test_a_stale_profile_snapshot_does_not_undo_a_switch_event() -> None:
    s = state()
    since = s.seq
    s.apply_event("profile.start", {"profile": "gemma", "previous": "dense", "engines": ["5060ti"]})
    s.apply_profile(profile_doc(), since=since)  # asked before the event: says dense, steady
    assert s.profile.state == "switching" and s.profile.active == "gemma" and s.profile.switch_engines == ["5060ti"]
    s.apply_profile(profile_doc(), since=s.seq)  # asked after it: the coordinator's word stands
    assert s.profile.state == "steady" and s.profile.active == "dense"


def test_recent_events_and_sessions_per_engine() -> None:
    s = state()
    for i in range(3):
        s.apply_event("route", {"req": f"r{i}", "engine": "5060ti", "session": f"s{i % 2}", "step": "affinity"},
                      ts=float(i))
    assert list(s.sessions_seen["5060ti"]) == ["s1", "s0"]  # most recent last
    for i in range(150):
        s.note("p100", float(i), f"line {i}")
    assert len(s.recent["p100"]) == 100 and s.recent["p100"][-1] == (149.0, "line 149")


def test_fmt_secs() -> None:
    assert [fmt_secs(v) for v in (None, 0.04, 9.94, 12.4, 185, 3725)] == ["?", "0.0s", "9.9s", "12s", "3m05s",
                                                                          "1h02m"]


def test_a_switch_the_admin_api_saw_end_before_its_events_arrived() -> None:
    s = state()
    s.apply_event("profile.start", {"profile": "gemma", "previous": "dense", "engines": ["5060ti", "p100"]})
    since = s.seq  # asked after profile.start, answered after the switch ended, before its last events
    doc = profile_doc()
    doc.update(active="gemma", previous="dense", state="steady", last_switch={
        "profile": "gemma", "ok": False, "seconds": 0.6, "failed": ["p100"],
        "engines": {"5060ti": {"ok": True, "seconds": 0.5}, "p100": {"ok": False, "error": "no memory", "seconds": 0.4}}})
    s.apply_profile(doc, since=since)
    assert s.profile.state == "steady"
    assert s.profile.switch_done == {"5060ti": {"ok": True, "error": None, "seconds": 0.5},
                                     "p100": {"ok": False, "error": "no memory", "seconds": 0.4}}
    s.apply_event("profile.engine", {"engine": "p100", "phase": "failed", "why": "profile gemma", "error": "no memory"})
    s.apply_event("profile.done", {"profile": "gemma", "ok": False, "seconds": 0.6, "failed": ["p100"]})
    assert switch_reasons(s.profile.last_switch) == {"p100": "no memory"}


def test_every_engine_stage_has_its_colour_in_the_stage_column() -> None:
    from hydrad.wire.stages import STAGES
    from tui.widgets.engines import STAGE_STYLES

    assert set(STAGES) <= set(STAGE_STYLES), sorted(set(STAGES) - set(STAGE_STYLES))

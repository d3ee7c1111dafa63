"""Routing: each of the four steps on crafted snapshots, the cost model, and route() as a whole."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.coordinator.routing import (
    DEFAULT_POLICY,
    GIB,
    QUANT_RULES,
    Candidate,
    Decision,
    EngineView,
    ModelSpec,
    RouteRequest,
    RoutingPolicy,
    affinity,
    cost,
    default_model,
    expected_wait,
    feasible,
    filter_candidates,
    holds_kv,
    load_estimate,
    quant_unsupported,
    rank,
    route,
)

SMOL = "smollm2-135m"
GEMMA = "gemma3-270m"
BIG = "big-iq"

MODELS: dict[str, ModelSpec] = {
    SMOL: ModelSpec(SMOL, size_bytes=98_362_432, kv_bytes_per_token=23_040, quant="Q4_1", arch="llama"),
    GEMMA: ModelSpec(GEMMA, size_bytes=253_113_024, kv_bytes_per_token=18_432, quant="Q4_K_M", arch="gemma3"),
    BIG: ModelSpec(BIG, size_bytes=10 * GIB, kv_bytes_per_token=160 * 1024, quant="IQ4_XS", arch="llama"),
}


def eng(name: str, **kw: object) -> EngineView:
    """A ready GPU engine serving smollm with 4 idle slots, unless told otherwise."""
    base: dict[str, object] = dict(
        name=name, alive=True, stage="ready", model=SMOL, models_on_disk=frozenset({SMOL, GEMMA, BIG}),
        slots_busy=0, slots_total=4, queued=0, max_queue=64, vram_total=16 * GIB, vram_free=12 * GIB,
        gpu_arch="sm_86", prefill_tps=2000.0, decode_tps=100.0, load_seconds=1.0,
    )
    base.update(kw)
    return EngineView(**base)  # type: ignore[arg-type]


def req(model: str | None = SMOL, **kw: object) -> RouteRequest:
    base: dict[str, object] = dict(model=model, prompt_tokens=500, max_tokens=200)
    base.update(kw)
    return RouteRequest(**base)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- step 2: filter


def test_filter_keeps_a_serving_engine() -> None:
    passed, rejected = filter_candidates(req(), [eng("a")])
    assert [e.name for e in passed] == ["a"] and rejected == {}


@pytest.mark.parametrize(
    ("view", "excl", "words"),
    [
        (eng("x", alive=False), frozenset(), "not alive"),
        (eng("x", stage="stopping"), frozenset(), "stage stopping"),
        (eng("x", stage="starting"), frozenset(), "stage starting"),
        (eng("x", stage="bogus"), frozenset(), "stage bogus"),
        (eng("x"), frozenset({"x"}), "excluded"),
        (eng("x", model=GEMMA, models_on_disk=frozenset({GEMMA})), frozenset(), f"neither serves nor has {SMOL} on disk, nor can fetch it"),
        (eng("x", slots_busy=4, queued=64), frozenset(), "full: 4/4 slots busy, 64/64 queued"),
        (eng("x", slots_busy=2, slots_total=2, queued=0, max_queue=0), frozenset(), "full"),
    ],
)
def test_filter_rejects_with_reason(view: EngineView, excl: frozenset[str], words: str) -> None:
    passed, rejected = filter_candidates(req(), [view], excl)
    assert passed == []
    assert rejected["x"].startswith("filter: ")
    assert words in rejected["x"]


def test_filter_accepts_engines_that_can_load_or_queue() -> None:
    views = [
        eng("idle", stage="idle", model=None, slots_total=0),  # model-less, has smollm on disk
        eng("other", model=GEMMA),  # serves gemma, can load smollm
        eng("loading", stage="loading_model"),
        eng("reloading", stage="reloading"),
        eng("queue", slots_busy=4, queued=10),  # all slots busy but queue room
    ]
    passed, rejected = filter_candidates(req(), views)
    assert {e.name for e in passed} == {"idle", "other", "loading", "reloading", "queue"}
    assert rejected == {}


def test_filter_without_load_keeps_only_serving_engines() -> None:
    views = [eng("a"), eng("b", model=GEMMA), eng("c", stage="idle", model=None), eng("d", stage="loading_model")]
    passed, rejected = filter_candidates(req(), views, allow_load=False)
    assert [e.name for e in passed] == ["a"]
    assert set(rejected) == {"b", "c", "d"}
    assert "serves gemma3-270m" in rejected["b"] and "serves nothing" in rejected["c"]


# --------------------------------------------------------------------------- step 3: feasibility


def test_serving_engine_is_feasible_whatever_it_reports() -> None:
    tiny = eng("a", model=BIG, vram_total=1, gpu_arch="sm_60")
    assert feasible(req(BIG), tiny, MODELS) is None


def test_vram_too_small_is_rejected_with_sizes() -> None:
    e = eng("small", model=SMOL, vram_total=8 * GIB)
    why = feasible(req(BIG, n_ctx=32768), e, MODELS)
    assert why is not None
    assert "needs" in why and "8.00 GiB" in why and "32768 tokens" in why


def test_vram_counts_kv_for_the_context() -> None:
    e = eng("a", model=SMOL, vram_total=12 * GIB, gpu_arch="sm_86")
    assert feasible(req(BIG, n_ctx=1024), e, MODELS) is None  # 10 GiB + 160 MiB + reserve fits 12 GiB
    assert feasible(req(BIG, n_ctx=16384), e, MODELS) is not None  # + 2.5 GiB of KV does not


def test_unknown_vram_and_unknown_size_fit() -> None:
    cpu = eng("cpu", model=None, stage="idle", vram_total=0, gpu_arch="cpu")
    assert feasible(req(BIG, n_ctx=1 << 20), cpu, MODELS) is None
    models = {"mystery": ModelSpec("mystery", size_bytes=0, kv_bytes_per_token=0)}
    assert feasible(req("mystery"), eng("g", vram_total=1 * GIB), models) is None
    assert feasible(req("not-in-registry"), eng("g", vram_total=1 * GIB), MODELS) is None


def test_weights_an_engine_keeps_in_host_memory_do_not_count_against_its_vram() -> None:
    """An MoE whose experts a load keeps on the CPU (n_cpu_moe, override_tensors) needs only the rest of
    its weights in VRAM: the engine reports that part per model on disk (REGISTER's host_weights)."""
    moe = {"moe": ModelSpec("moe", size_bytes=20 * GIB, kv_bytes_per_token=0)}
    plain = eng("a", model=SMOL, vram_total=16 * GIB)
    why = feasible(req("moe"), plain, moe)
    assert why is not None and "weights 20.00 GiB" in why and "host memory" not in why
    offloading = eng("b", model=SMOL, vram_total=16 * GIB, host_weights={"moe": 12 * GIB})
    assert feasible(req("moe"), offloading, moe) is None  # 8 GiB on the GPU
    too_little = eng("c", model=SMOL, vram_total=6 * GIB, host_weights={"moe": 12 * GIB})
    why = feasible(req("moe"), too_little, moe)
    assert why is not None and "weights 8.00 GiB, 12.00 GiB more kept in host memory" in why
    other = eng("d", model=SMOL, vram_total=16 * GIB, host_weights={"other": 12 * GIB})
    assert feasible(req("moe"), other, moe) is not None  # another model's offload says nothing of this one
    silly = eng("e", model=SMOL, vram_total=16 * GIB, host_weights={"moe": 99 * GIB})
    assert feasible(req("moe"), silly, moe) is None  # never more than the model: nothing left for the GPU


def test_reserve_is_part_of_the_policy() -> None:
    spec = {"m": ModelSpec("m", size_bytes=GIB, kv_bytes_per_token=0)}
    e = eng("a", vram_total=GIB + 100)
    assert feasible(req("m"), e, spec) is not None
    assert feasible(req("m"), e, spec, policy=RoutingPolicy(vram_reserve_bytes=0)) is None


@pytest.mark.parametrize("arch", ["sm_60", "sm_61", "SM_60"])
def test_iq_quant_on_pascal_is_rejected(arch: str) -> None:
    e = eng("p100", vram_total=16 * GIB, gpu_arch=arch)
    why = feasible(req(BIG, n_ctx=1024), e, MODELS)
    assert why is not None and "IQ4_XS" in why and "Pascal" in why


@pytest.mark.parametrize("arch", ["sm_70", "sm_86", "sm_120", "cpu", "gfx1100", ""])
def test_iq_quant_elsewhere_is_fine(arch: str) -> None:
    e = eng("g", vram_total=16 * GIB, gpu_arch=arch)
    assert feasible(req(BIG, n_ctx=1024), e, MODELS) is None


def test_quant_table() -> None:
    assert quant_unsupported("IQ2_XXS", "sm_60")
    assert quant_unsupported("iq4_nl", "sm_61")
    assert quant_unsupported("Q4_K_M", "sm_60") is None
    assert quant_unsupported("Q4_1", "sm_60") is None
    assert quant_unsupported(None, "sm_60") is None
    assert quant_unsupported("IQ3_S", "sm_52")
    assert all(r.why and r.archs and r.quant_prefix for r in QUANT_RULES)


# --------------------------------------------------------------------------- step 4: cost


def test_wait_is_zero_with_a_free_slot() -> None:
    assert expected_wait(req(), eng("a", slots_busy=3)) == 0.0


def test_wait_counts_requests_ahead_spread_over_slots() -> None:
    r = req(max_tokens=200)
    full = eng("a", slots_busy=4, slots_total=4, queued=0, decode_tps=100.0)
    assert expected_wait(r, full) == pytest.approx(1 * 2.0 / 4)  # one slot frees in T/4
    queued = replace(full, queued=3)
    assert expected_wait(r, queued) == pytest.approx(4 * 2.0 / 4)


def test_wait_uses_default_decode_speed_when_unmeasured() -> None:
    e = eng("a", slots_busy=1, slots_total=1, decode_tps=0.0)
    assert expected_wait(req(max_tokens=100), e) == pytest.approx(100 / DEFAULT_POLICY.default_decode_tps)


def test_wait_of_a_model_less_engine_is_its_queue_only() -> None:
    idle = eng("a", stage="idle", model=None, slots_total=0, slots_busy=0, queued=0)
    assert expected_wait(req(), idle) == 0.0


def test_load_estimate_cases() -> None:
    serving = eng("a")
    assert load_estimate(SMOL, serving, MODELS) == 0.0
    # same model, not yet serving: its measured load time
    loading = eng("a", stage="loading_model", load_seconds=7.0)
    assert load_estimate(SMOL, loading, MODELS) == 7.0
    # another model: the current model's load time is no guide; size at the assumed disk rate
    other = eng("a", model=SMOL, load_seconds=9.0)
    assert load_estimate(GEMMA, other, MODELS) == pytest.approx(253_113_024 / 2e9)
    assert load_estimate(GEMMA, other, MODELS, RoutingPolicy(disk_bytes_per_s=1e8)) == pytest.approx(2.53113024)
    # nothing measured: size at the assumed disk rate
    fresh = eng("a", stage="idle", model=None, load_seconds=None)
    assert load_estimate(GEMMA, fresh, MODELS) == pytest.approx(253_113_024 / 2e9)
    # size unknown too
    assert load_estimate("unknown", fresh, MODELS) == DEFAULT_POLICY.unknown_load_s


def test_cost_is_wait_plus_load_plus_prefill() -> None:
    e = eng("a", model=GEMMA, slots_busy=4, queued=0, prefill_tps=1000.0, decode_tps=100.0, load_seconds=None)
    c = cost(req(prompt_tokens=2000, max_tokens=200), e, MODELS)
    assert c.wait_s == pytest.approx(0.5)
    assert c.load_s == pytest.approx(98_362_432 / 2e9)
    assert c.prefill_s == pytest.approx(2.0)
    assert c.cost_s == pytest.approx(c.wait_s + c.load_s + c.prefill_s)
    assert not c.warm


def test_warm_cost_prefills_only_the_new_turn() -> None:
    e = eng("a", prefill_tps=100.0)
    cold = cost(req(prompt_tokens=5000), e, MODELS)
    warm = cost(req(prompt_tokens=5000), e, MODELS, warm=True)
    assert cold.prefill_s == pytest.approx(50.0)
    assert warm.prefill_s == pytest.approx(DEFAULT_POLICY.warm_uncached_tokens / 100.0)
    assert warm.warm and warm.cost_s < cold.cost_s
    short = cost(req(prompt_tokens=10), e, MODELS, warm=True)
    assert short.prefill_s == pytest.approx(0.1)


def test_a_session_kept_in_the_store_is_lukewarm_restore_not_prefill() -> None:
    """The session's 4,000 kept tokens cost bytes ÷ restore speed, only the rest is prefilled; where
    prefilling is the quicker way (a fast engine), the candidate is costed as cold, as the engine acts."""
    kv = MODELS[SMOL].kv_bytes_per_token
    slow = eng("slow", prefill_tps=100.0)
    c = cost(req(prompt_tokens=5000, stored_tokens=4000), slow, MODELS)
    assert c.lukewarm and not c.warm
    assert c.restore_s == pytest.approx(4000 * kv / DEFAULT_POLICY.restore_bytes_per_s)
    assert c.prefill_s == pytest.approx(c.restore_s + 1000 / 100.0)
    assert c.public()["lukewarm"] is True and c.public()["restore_s"] > 0
    fast = eng("fast", prefill_tps=1e9)
    f = cost(req(prompt_tokens=5000, stored_tokens=4000), fast, MODELS)
    assert not f.lukewarm and f.restore_s == 0 and f.prefill_s == pytest.approx(5000 / 1e9)
    assert "lukewarm" not in cost(req(prompt_tokens=5000), slow, MODELS).public()


def test_cost_prefers_engine_already_serving_over_one_that_must_load() -> None:
    serving = eng("serving", model=GEMMA, prefill_tps=1000.0)
    loader = eng("loader", model=SMOL, prefill_tps=2000.0)  # prefills twice as fast, but must load first
    d = route(req(GEMMA, prompt_tokens=100), [loader, serving], MODELS)
    assert (d.engine, d.step) == ("serving", "cost")
    by = {c.engine: c for c in d.candidates}
    assert by["serving"].load_s == 0.0
    assert by["loader"].load_s == pytest.approx(253_113_024 / 2e9)


def test_an_engine_that_must_fetch_the_model_first_may_load_it_and_is_charged_the_transfer() -> None:
    """A model the engine lacks but would fetch from the pool: eligible for an on-demand load, its
    cost the transfer (size at fetch_bytes_per_s) on top of the load, so an engine that has the file
    wins; one that neither has nor can fetch it is filtered out, naming why."""
    fetcher = eng("fetcher", stage="idle", model=None, models_on_disk=frozenset(), models_fetchable=frozenset({GEMMA}))
    haver = eng("haver", stage="idle", model=None, models_on_disk=frozenset({GEMMA}))
    load = 253_113_024 / 2e9
    assert load_estimate(GEMMA, fetcher, MODELS) == pytest.approx(load + 253_113_024 / 1e8)
    assert load_estimate(GEMMA, fetcher, MODELS, RoutingPolicy(fetch_bytes_per_s=1e9)) == pytest.approx(
        load + 253_113_024 / 1e9)
    assert load_estimate("unknown", replace(fetcher, models_fetchable=frozenset({"unknown"})), MODELS) == \
        2 * DEFAULT_POLICY.unknown_load_s
    d = route(req(GEMMA), [fetcher, haver], MODELS)
    assert d.engine == "haver"
    alone = route(req(GEMMA), [fetcher], MODELS)
    assert alone.engine == "fetcher" and alone.candidates[0].load_s == pytest.approx(load + 253_113_024 / 1e8)
    none = route(req(SMOL), [fetcher], MODELS)
    assert none.engine is None and none.rejected["fetcher"].endswith(f"has {SMOL} on disk, nor can fetch it")


def test_cost_prefers_faster_prefill_for_long_prompts() -> None:
    slow = eng("p100", prefill_tps=800.0)
    fast = eng("5060ti", prefill_tps=4000.0)
    d = route(req(prompt_tokens=8000), [slow, fast], MODELS)
    assert d.engine == "5060ti"
    assert [c.engine for c in d.candidates] == ["5060ti", "p100"]


def test_cost_prefers_idle_engine_over_busy_one() -> None:
    busy = eng("busy", slots_busy=4, queued=5)
    idle = eng("idle")
    assert route(req(), [busy, idle], MODELS).engine == "idle"


def test_ties_go_to_fewer_busy_slots_then_name() -> None:
    a = eng("a", slots_busy=2)
    b = eng("b", slots_busy=1)
    c = eng("c", slots_busy=1)
    d = route(req(), [a, c, b], MODELS)
    assert [x.engine for x in d.candidates] == ["b", "c", "a"]
    assert d.engine == "b"


def test_rank_orders_by_cost() -> None:
    views = {n: eng(n) for n in "xyz"}
    cands = [Candidate("x", 3.0, 0, 0, 3.0, False), Candidate("y", 1.0, 0, 0, 1.0, False),
             Candidate("z", 2.0, 0, 0, 2.0, False)]
    assert [c.engine for c in rank(cands, views)] == ["y", "z", "x"]


# --------------------------------------------------------------------------- step 1: affinity


def test_holds_kv_needs_ready_same_model_and_the_session() -> None:
    e = eng("a", sessions=frozenset({"s1"}), cached_prefixes=frozenset({"p1"}))
    assert holds_kv(req(session_id="s1"), e) == "session s1"
    assert holds_kv(req(prefix_hash="p1"), e) == "prefix p1"
    assert holds_kv(req(session_id="s2"), e) is None
    assert holds_kv(req(GEMMA, session_id="s1"), e) is None
    assert holds_kv(req(session_id="s1"), replace(e, stage="reloading")) is None


def test_affinity_wins_outright_over_a_cheaper_engine() -> None:
    warm = eng("3060", prefill_tps=500.0, slots_busy=4, queued=1, sessions=frozenset({"s1"}))
    fast = eng("5060ti", prefill_tps=5000.0)
    d = route(req(session_id="s1", prompt_tokens=300), [warm, fast], MODELS)
    assert (d.engine, d.step) == ("3060", "affinity")
    assert d.reason == "session s1 is warm on 3060"
    assert any(c.warm and c.engine == "3060" for c in d.candidates)


def test_affinity_on_prefix() -> None:
    warm = eng("b", cached_prefixes=frozenset({"sys-prompt"}))
    d = route(req(prefix_hash="sys-prompt", prompt_tokens=4000), [eng("a"), warm], MODELS)
    assert (d.engine, d.step) == ("b", "affinity")
    assert "prefix sys-prompt" in d.reason


def test_affinity_loses_to_a_much_cheaper_idle_engine() -> None:
    # 60 requests queued at 2 s each over 4 slots: a 31 s wait against a fraction of a second
    warm = eng("3060", slots_busy=4, queued=60, decode_tps=100.0, sessions=frozenset({"s1"}))
    idle = eng("5060ti")
    d = route(req(session_id="s1", max_tokens=200), [warm, idle], MODELS)
    assert (d.engine, d.step) == ("5060ti", "cost")
    assert "warm on 3060" in d.reason and "margin" in d.reason and "cheapest" in d.reason


def test_affinity_margin_is_configurable() -> None:
    warm = eng("w", slots_busy=4, queued=1, decode_tps=100.0, sessions=frozenset({"s1"}))  # wait 1.0 s
    idle = eng("i", prefill_tps=1e9)  # total ≈ 0 s
    r = req(session_id="s1", max_tokens=200)
    assert route(r, [warm, idle], MODELS).engine == "w"  # within the default 2 s margin
    tight = RoutingPolicy(affinity_margin_s=0.5)
    d = route(r, [warm, idle], MODELS, policy=tight)
    assert (d.engine, d.step) == ("i", "cost")


def test_affinity_margin_is_a_coordinator_setting() -> None:
    """``affinity_margin_s`` in coordinator.yaml reaches the front door's routing; a negative one is refused by name."""
    from types import SimpleNamespace

    import pydantic

    from hydrad.coordinator.frontdoor import FrontDoor
    from hydrad.coordinator.settings import CoordinatorSettings
    bus = SimpleNamespace(engines={}, listeners=[], inflight=lambda name: 0, inflight_total=lambda: 0)
    switcher = SimpleNamespace(locked=lambda name: False, placed=lambda name: (False, None))
    front = FrontDoor(CoordinatorSettings(affinity_margin_s=0.5), bus, switcher, SimpleNamespace(entries={}))  # type: ignore[arg-type]
    assert front.policy.affinity_margin_s == 0.5
    assert FrontDoor(CoordinatorSettings(), bus, switcher, SimpleNamespace(entries={})).policy == DEFAULT_POLICY  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="affinity_margin_s"):
        CoordinatorSettings(affinity_margin_s=-1)


def test_affinity_direct_call_session_beats_prefix() -> None:
    r = req(session_id="s1", prefix_hash="p")
    views = [eng("prefix", cached_prefixes=frozenset({"p"}), prefill_tps=1e6),
             eng("session", sessions=frozenset({"s1"}), prefill_tps=10.0)]
    scored = [cost(r, e, MODELS, warm=True) for e in views]
    v = affinity(r, views, scored, margin_s=100.0)
    assert v.engine == "session" and v.reason == "session s1 is warm on session"


def test_affinity_without_warm_engine_says_nothing() -> None:
    views = [eng("a")]
    v = affinity(req(session_id="s9"), views, [cost(req(), views[0], MODELS)])
    assert v.engine is None and v.reason == ""


def test_affinity_alone_wins_whatever_its_wait() -> None:
    warm = eng("w", slots_busy=4, queued=63, sessions=frozenset({"s1"}))
    d = route(req(session_id="s1"), [warm], MODELS)
    assert (d.engine, d.step) == ("w", "affinity")


def test_warm_engine_that_is_excluded_or_full_does_not_win() -> None:
    warm = eng("w", sessions=frozenset({"s1"}))
    d = route(req(session_id="s1"), [warm, eng("o")], MODELS, exclude=frozenset({"w"}))
    assert d.engine == "o" and "excluded" in d.rejected["w"]
    full = replace(warm, slots_busy=4, queued=64)
    d = route(req(session_id="s1"), [full, eng("o")], MODELS)
    assert d.engine == "o" and d.rejected["w"].startswith("filter: full")


# --------------------------------------------------------------------------- route


def test_no_candidate_lists_every_engine() -> None:
    views = [
        eng("dead", alive=False),
        eng("stop", stage="stopping"),
        eng("excl"),
        eng("nodisk", model=GEMMA, models_on_disk=frozenset({GEMMA})),
        eng("small", model=SMOL, vram_total=4 * GIB),
        eng("pascal", model=SMOL, gpu_arch="sm_60"),
    ]
    d = route(req(BIG, n_ctx=4096), views, MODELS, exclude=frozenset({"excl"}))
    assert d.engine is None and d.step == "none" and d.candidates == ()
    assert set(d.rejected) == {v.name for v in views}
    for name in d.rejected:
        assert f"{name}: " in d.reason
    assert d.rejected["small"].startswith("feasible: ") and d.rejected["pascal"].startswith("feasible: ")
    assert d.rejected["nodisk"].startswith("filter: ")
    assert d.reason.startswith(f"no engine can take {BIG}: ")


def test_no_engines_at_all() -> None:
    d = route(req(), [], MODELS)
    assert d == Decision(None, "none", "no engine is registered", (), {}, SMOL)


def test_request_without_model_goes_to_the_default_served_model() -> None:
    views = [eng("g", model=GEMMA), eng("s", model=SMOL), eng("i", stage="idle", model=None)]
    d = route(req(None), views, MODELS)
    assert d.model == SMOL and d.engine == "s"  # smollm is first in the registry
    assert "serves gemma3-270m, not smollm2-135m" in d.rejected["g"] and "serves nothing" in d.rejected["i"]
    only_gemma = route(req(None), [eng("g", model=GEMMA)], MODELS)
    assert (only_gemma.model, only_gemma.engine) == (GEMMA, "g")


def test_request_without_model_never_loads() -> None:
    d = route(req(None), [eng("i", stage="idle", model=None)], MODELS)
    assert d.engine is None and "no engine can take a request without a model" in d.reason


def test_load_on_demand_off_keeps_only_serving_engines() -> None:
    views = [eng("g", model=GEMMA), eng("i", stage="idle", model=None)]
    assert route(req(SMOL), views, MODELS).engine is not None
    d = route(req(SMOL), views, MODELS, policy=RoutingPolicy(load_on_demand=False))
    assert d.engine is None and "may not load a model" in d.rejected["g"]
    served = route(req(GEMMA), views, MODELS, policy=RoutingPolicy(load_on_demand=False))
    assert served.engine == "g"


def test_default_model_skips_excluded_and_unregistered() -> None:
    views = [eng("s", model=SMOL), eng("x", model="zzz"), eng("y", model="aaa")]
    assert default_model(views, MODELS) == SMOL
    assert default_model(views, MODELS, frozenset({"s"})) == "aaa"
    assert default_model([], MODELS) is None


def test_duplicate_names_keep_the_first_view() -> None:
    d = route(req(), [eng("a", alive=False), eng("a")], MODELS)
    assert d.engine is None and list(d.rejected) == ["a"]


def test_public_is_json() -> None:
    views = [eng("a", sessions=frozenset({"s"})), eng("b", alive=False)]
    d = route(req(session_id="s"), views, MODELS)
    data = json.loads(json.dumps(d.public()))
    assert data["engine"] == "a" and data["step"] == "affinity" and data["model"] == SMOL
    assert data["rejected"] == {"b": "filter: not alive (heartbeats missed)"}
    assert set(data["candidates"][0]) == {"engine", "cost_s", "wait_s", "load_s", "prefill_s", "warm"}


def test_modelspec_from_registry_entry() -> None:
    from hydrad.common.registry import ModelEntry

    entry = ModelEntry(path="x.gguf", arch="llama", quant="Q4_1", size_bytes=10, kv_bytes_per_token=2)
    assert ModelSpec.from_entry("x", entry) == ModelSpec("x", 10, 2, "Q4_1", "llama")
    assert ModelSpec.from_entry("y", ModelEntry(path="y.gguf")) == ModelSpec("y", 0, 0, None, None)


# --------------------------------------------------------------------------- property

NAMES = ["a", "b", "c", "d", "e"]
ALIASES = [SMOL, GEMMA, BIG, "other"]
STAGES = ["idle", "loading_model", "warming", "ready", "reloading", "stopping", "starting"]
ARCHS = ["cpu", "sm_60", "sm_61", "sm_86", "sm_120", "weird"]
small = st.integers(min_value=0, max_value=100)
speed = st.one_of(st.just(0.0), st.floats(min_value=0.001, max_value=1e6))

views = st.builds(
    EngineView,
    name=st.sampled_from(NAMES),
    alive=st.booleans(),
    stage=st.sampled_from(STAGES),
    model=st.one_of(st.none(), st.sampled_from(ALIASES)),
    models_on_disk=st.frozensets(st.sampled_from(ALIASES)),
    slots_busy=small,
    slots_total=st.integers(min_value=0, max_value=8),
    queued=small,
    max_queue=st.integers(min_value=0, max_value=64),
    vram_total=st.integers(min_value=0, max_value=64 * GIB),
    vram_free=st.integers(min_value=0, max_value=64 * GIB),
    gpu_arch=st.sampled_from(ARCHS),
    prefill_tps=speed,
    decode_tps=speed,
    load_seconds=st.one_of(st.none(), st.floats(min_value=0, max_value=600)),
    sessions=st.frozensets(st.sampled_from(["s1", "s2"])),
    cached_prefixes=st.frozensets(st.sampled_from(["p1", "p2"])),
)
requests = st.builds(
    RouteRequest,
    model=st.one_of(st.none(), st.sampled_from(ALIASES)),
    prompt_tokens=st.integers(min_value=0, max_value=200_000),
    max_tokens=st.integers(min_value=0, max_value=8192),
    session_id=st.one_of(st.none(), st.sampled_from(["s1", "s2", "s3"])),
    prefix_hash=st.one_of(st.none(), st.sampled_from(["p1", "p3"])),
    n_ctx=st.integers(min_value=0, max_value=1 << 20),
)


@settings(max_examples=400, deadline=None)
@given(requests, st.lists(views, max_size=6), st.frozensets(st.sampled_from(NAMES)), st.floats(0, 100))
def test_route_never_raises_and_is_consistent(
    r: RouteRequest, engines: list[EngineView], exclude: frozenset[str], margin: float
) -> None:
    d = route(r, engines, MODELS, exclude=exclude, policy=RoutingPolicy(affinity_margin_s=margin))
    names = {e.name for e in engines}
    chosen = {c.engine for c in d.candidates}
    assert chosen | set(d.rejected) == names
    assert not chosen & set(d.rejected)
    assert not chosen & exclude
    costs = [c.cost_s for c in d.candidates]
    assert costs == sorted(costs) or len({round(x, 6) for x in costs}) < len(costs)
    assert all(c.cost_s >= 0 and c.wait_s >= 0 and c.load_s >= 0 and c.prefill_s >= 0 for c in d.candidates)
    if d.engine is None:
        assert d.step == "none" and not d.candidates and d.reason
    else:
        assert d.step in ("affinity", "cost")
        assert d.engine in chosen
        assert d.engine not in d.rejected and d.engine not in exclude
        if d.step == "cost":
            assert d.engine == d.candidates[0].engine
    json.dumps(d.public())


# --------------------------------------------------------------------------- a sleeping engine


def test_a_sleeping_engine_is_routed_to_as_one_that_loads_its_model() -> None:
    """The idle sleep freed the model (stage sleeping, the model still named): the request goes there,
    costed with the engine's measured load time, whether or not the request may load a model."""
    asleep = eng("a", stage="sleeping", slots_total=0, load_seconds=2.5)
    for policy in (DEFAULT_POLICY, replace(DEFAULT_POLICY, load_on_demand=False)):
        d = route(req(), [asleep], MODELS, policy=policy)
        assert d.engine == "a", d.reason
        assert d.candidates[0].load_s == 2.5
    # a serving engine is cheaper than one that must load first
    assert route(req(), [asleep, eng("b")], MODELS).engine == "b"
    # a request without a model gets the sleeping engine's
    assert route(req(None), [asleep], MODELS).engine == "a"
    # asleep with another model: not routed to without loading on demand
    other = eng("c", stage="sleeping", model=GEMMA, slots_total=0)
    assert route(req(), [other], MODELS, policy=replace(DEFAULT_POLICY, load_on_demand=False)).engine is None

"""The prefill/decode split's plan: a pure decision over recorded speeds, tested on crafted pools.

The speeds below are of the kind engines report in heartbeats (prompt and generated tokens per
second); the pool is two engines of one KV family, one serving the requested Q4 model and one a
Q8_0 sibling, unless a test says otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hydrad.common.registry import ModelEntry
from hydrad.coordinator.frontdoor import FrontDoor
from hydrad.coordinator.kvmove import Moved, TransferMeter
from hydrad.coordinator.pdsplit import TransferRates, plan_split
from hydrad.coordinator.records import EngineRecord
from hydrad.coordinator.routing import DEFAULT_POLICY, EngineView, ModelSpec, RouteRequest, route
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.wire import messages as M

Q4, Q8 = "smol", "smol-q8"
FAMILY = "fam-smol"
MODELS = {Q4: ModelSpec(Q4, 98_000_000, 23_040, "Q4_1", "llama"), Q8: ModelSpec(Q8, 145_000_000, 23_040, "Q8_0", "llama")}
FAST_NET = TransferRates(2e9, {FAMILY: 23_040.0})


def eng(name: str, model: str | None = Q4, **kw: object) -> EngineView:
    base: dict[str, object] = dict(name=name, alive=True, stage="ready", model=model, models_on_disk=frozenset(),
                                   slots_busy=0, slots_total=4, queued=0, prefill_tps=500.0, decode_tps=50.0,
                                   kv_family=FAMILY)
    base.update(kw)
    return EngineView(**base)  # type: ignore[arg-type]


def plan(engines: list[EngineView], prompt: int = 4000, max_tokens: int = 64, rates: TransferRates = FAST_NET,
         **kw: object):
    r = RouteRequest(model=Q4, prompt_tokens=prompt, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]
    decision = route(r, engines, MODELS)
    return plan_split(r, decision, engines, MODELS, rates)


def test_a_fast_prefill_engine_of_a_sibling_quant_prefills_for_the_slow_one() -> None:
    slow, fast = eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=4000.0)
    p, why = plan([slow, fast])
    assert p is not None, why
    assert (p.prefill, p.decode, p.prefill_model, p.single) == ("fast", "slow", Q8, "slow")
    # 4000 tokens: 1 s on fast (+ its one token), 20 s on slow; transfer 92 MB at 2 GB/s plus the fixed part
    # assumed until one was measured; decode 64 at 50 tok/s
    assert p.prefill_s == pytest.approx(1.0 + 1 / 50)
    assert p.transfer_s == pytest.approx(DEFAULT_POLICY.transfer_fixed_s + 4000 * 23_040 / 2e9
                                         + DEFAULT_POLICY.split_round_trip_s)
    assert p.decode_s == pytest.approx(1 / 200 + 64 / 50)
    assert p.single_s == pytest.approx(20.0 + 64 / 50)
    assert p.total_s < p.single_s
    assert "fast prefills, slow decodes" in why


def test_equal_engines_never_split() -> None:
    p, why = plan([eng("a"), eng("b")])
    assert p is None and "no split pays" in why


def test_a_short_prompt_does_not_pay_for_the_transfer() -> None:
    slow, fast = eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=4000.0)
    slow_net = TransferRates(1e6, {FAMILY: 23_040.0})  # 1 MB/s: the KV of 50 tokens takes 1.15 s
    p, why = plan([slow, fast], prompt=50, rates=slow_net)
    assert p is None and "no split pays" in why
    p, _ = plan([slow, fast], prompt=50)  # on a fast network the same short prompt still gains about 0.15 s
    assert p is not None


def test_the_transfer_speed_is_what_the_meter_measured() -> None:
    slow, fast = eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=4000.0)
    meter = TransferMeter()
    meter.record(Moved(slot=1, n_tokens=1000, n_bytes=23_040_000, seconds=23.04), FAMILY)  # 1 MB/s
    rates = TransferRates.of(meter)
    assert rates.bytes_per_s == pytest.approx(1e6) and rates.per_token(FAMILY) == pytest.approx(23_040)
    assert rates.fixed_s == 0.0 and rates.transfers == 1
    p, why = plan([slow, fast], rates=rates)
    assert p is None and "no split pays" in why  # 92 s of transfer against 20 s of prefill
    meter.record(Moved(slot=1, n_tokens=1000, n_bytes=23_040_000, seconds=0.01), FAMILY)
    assert meter.bytes_per_s > 1e8
    p, _ = plan([slow, fast], rates=TransferRates.of(meter))
    assert p is not None and p.prefill == "fast"


def test_unmeasured_speeds_never_make_a_plan() -> None:
    p, why = plan([eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=0.0, decode_tps=0.0)])
    assert p is None
    p, why = plan([eng("slow", prefill_tps=0.0), eng("fast", Q8, prefill_tps=4000.0)])
    assert p is None and "not measured" in why


def test_another_family_or_no_free_slot_is_never_a_prefill_engine() -> None:
    slow = eng("slow", prefill_tps=200.0)
    for other in (eng("fast", Q8, prefill_tps=4000.0, kv_family="another"),
                  eng("fast", Q8, prefill_tps=4000.0, slots_busy=4),
                  eng("fast", Q8, prefill_tps=4000.0, stage="reloading"),
                  eng("fast", Q8, prefill_tps=4000.0, alive=False)):
        p, why = plan([slow, other])
        assert p is None, other
        assert "free slot" in why


def test_the_decode_engine_needs_a_free_slot_for_the_kv() -> None:
    p, _ = plan([eng("slow", prefill_tps=200.0, slots_busy=4, queued=1), eng("fast", Q8, prefill_tps=4000.0)])
    assert p is None


def test_the_best_single_engine_is_the_baseline() -> None:
    """A fast engine serving the requested model itself beats any split through it."""
    p, why = plan([eng("slow", prefill_tps=200.0), eng("fast", Q4, prefill_tps=4000.0)])
    assert p is None and "on fast alone" in why


def test_a_warm_session_or_a_stored_one_is_not_split() -> None:
    slow, fast = eng("slow", prefill_tps=200.0, sessions=frozenset({"s1"})), eng("fast", Q8, prefill_tps=4000.0)
    p, why = plan([slow, fast], session_id="s1")
    assert p is None and "affinity" in why
    p, why = plan([eng("slow", prefill_tps=200.0), fast], stored_tokens=3000)
    assert p is None and "Store" in why


def test_unknown_kv_size_means_no_plan() -> None:
    slow, fast = eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=4000.0)
    models = {Q4: ModelSpec(Q4, 0, 0), Q8: ModelSpec(Q8, 0, 0)}
    r = RouteRequest(model=Q4, prompt_tokens=4000, max_tokens=64)
    p, why = plan_split(r, route(r, [slow, fast], models), [slow, fast], models, TransferRates(2e9, {}))
    assert p is None and "KV size per token" in why


def test_the_prefill_engine_needs_a_free_slot_not_queue_room() -> None:
    slow = eng("slow", prefill_tps=200.0)
    assert plan([slow, eng("fast", Q8, prefill_tps=4000.0, slots_total=2, slots_busy=1)])[0] is not None
    assert plan([slow, eng("fast", Q8, prefill_tps=4000.0, slots_total=2, slots_busy=2, queued=3)])[0] is None


def test_the_meter_learns_a_fixed_part_from_small_transfers() -> None:
    meter = TransferMeter()
    meter.record(Moved(slot=0, n_tokens=4000, n_bytes=100_000_000, seconds=0.1), FAMILY)  # 1 GB/s
    for _ in range(20):  # 10 KB in 30 ms: almost all of it fixed cost
        meter.record(Moved(slot=0, n_tokens=1, n_bytes=10_000, seconds=0.03), FAMILY)
    assert meter.bytes_per_s == pytest.approx(1e9)  # small transfers do not teach bandwidth
    assert meter.fixed_s == pytest.approx(0.03, rel=0.01)
    meter.record(Moved(slot=0, n_tokens=1, n_bytes=10_000, seconds=float("inf")), FAMILY)
    meter.record(Moved(slot=0, n_tokens=1, n_bytes=0, seconds=1.0), FAMILY)
    assert meter.fixed_s == pytest.approx(0.03, rel=0.01) and meter.transfers == 21
    # a fixed part of 30 ms is what a short prompt's split costs beside its bytes
    slow, fast = eng("slow", prefill_tps=200.0), eng("fast", Q8, prefill_tps=4000.0)
    p, why = plan([slow, fast], prompt=10, rates=TransferRates.of(meter))
    assert p is None and "no split pays" in why


# ----- the same estimate on a session's turn: move its KV, or prefill it ------------------------


def _front(prefill_tps: float) -> FrontDoor:
    rec = EngineRecord(name="gpu", info=M.Register(engine="gpu", instance="p.1", version="t", rpc="127.0.0.1:1"),
                       status=M.EngineStatus(stage="ready", model=Q4, prefill_tps=prefill_tps, kv_family=FAMILY))
    bus = SimpleNamespace(engines={"gpu": rec}, listeners=[], inflight=lambda name: 0, inflight_total=lambda: 0)
    switcher = SimpleNamespace(locked=lambda name: False, placed=lambda name: (False, None))
    registry = SimpleNamespace(entries={Q4: ModelEntry(path="m.gguf", kv_bytes_per_token=23_040)})
    return FrontDoor(CoordinatorSettings(), bus, switcher, registry)  # type: ignore[arg-type]


def test_a_session_moves_only_when_its_transfer_beats_prefilling_it() -> None:
    """A CPU engine prefills 300 tokens/s: 2,000 tokens of KV (46 MB) move far faster. A GPU engine prefilling
    50,000 tokens/s computes them in 40 ms, less than the transfer's fixed part plus 46 MB at 1 GB/s."""
    assert _front(300.0).mobility.transfer_pays(2000, "gpu", Q4)
    assert not _front(50_000.0).mobility.transfer_pays(2000, "gpu", Q4)
    front = _front(50_000.0)
    front.meter.record(Moved(slot=0, n_tokens=4000, n_bytes=92_160_000, seconds=0.0092), FAMILY)  # 10 GB/s, no fixed part
    assert front.mobility.transfer_pays(2000, "gpu", Q4)  # 4.6 ms against 40 ms
    assert _front(0.0).mobility.transfer_pays(2000, "gpu", Q4)  # unmeasured: keep the KV
    assert _front(300.0).mobility.transfer_pays(2000, "nowhere", Q4)

"""Session mobility's ordering rules, on recorded engine states (the moves themselves are faked here: the
real ones stream KV between merged ports and are tested in tests/integration/test_sessions.py).

A turn that ends on an engine that is reloading moves its KV off at once, while the engine still holds
it; the session's next turn, arriving while that move runs, waits for it and is pinned to the slot it
filled instead of starting a second move or restoring an older turn from the Store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.kvmove import Moved, Placements, TransferMeter
from hydrad.coordinator.mobility import SessionMobility
from hydrad.coordinator.records import EngineRecord
from hydrad.wire import messages as M

MODEL = "smollm2-135m"


def _rec(name: str, stage: str, model: str = MODEL) -> EngineRecord:
    return EngineRecord(name=name, info=M.Register(engine=name, instance=f"{name}.1", version="t", rpc="127.0.0.1:1"),
                        status=M.EngineStatus(stage=stage, model=model, prefill_tps=300.0, kv_family="fam"))


class FakeKeeper:
    """The parts of SessionKeeper mobility uses; a move takes ``delay`` seconds and lands in slot 3,
    recorded where the real keeper records it: in the coordinator's one Affinity (``places``)."""

    def __init__(self, delay: float, places: Affinity) -> None:
        self.delay, self.moves, self.restores, self.places = delay, [], [], places

    def model_of(self, session: str) -> str:
        return MODEL

    def knows(self, session: str) -> bool:
        return self.places.latest(session) is not None

    def kept_tokens(self, session: str, model: str) -> int:
        return 800

    async def move(self, session: str, dst: str) -> Moved:
        self.moves.append((session, dst))
        await asyncio.sleep(self.delay)
        self.places.placed(session, dst, 3, "digest", MODEL, foreign=False, pin=True)
        return Moved(slot=3, n_tokens=800, n_bytes=18_000_000, seconds=self.delay)

    async def restore(self, session: str, engine: str) -> Any:
        self.restores.append((session, engine))
        return None


def _mobility(delay: float = 0.05) -> tuple[SessionMobility, FakeKeeper, dict[str, EngineRecord], Affinity]:
    engines = {"a": _rec("a", "reloading"), "b": _rec("b", "ready")}
    bus = SimpleNamespace(engines=engines, inflight=lambda name: 0)
    affinity = Affinity()
    keeper = FakeKeeper(delay, affinity)
    affinity.record("a", "s", None, None)
    affinity.turn_ended("s", "a", 0, "digest", MODEL)
    return SessionMobility(bus, keeper, affinity, TransferMeter(), {}), keeper, engines, affinity  # type: ignore[arg-type]


def test_a_turn_ending_on_a_reloading_engine_moves_off_and_the_next_turn_waits_for_that_move() -> None:
    async def go() -> None:
        mob, keeper, _, affinity = _mobility()
        mob.after_turn("s", "a")
        slot = await mob.restore("s", "b")  # the next turn, routed to b while the move runs
        assert slot == 3, "the turn is pinned to the slot the move filled"
        assert keeper.moves == [("s", "b")], "one move, not a second one for the turn"
        assert keeper.restores == [], "nothing restored from the Store"
        assert affinity.engine_of("s") == "b"

    asyncio.run(go())


def test_a_turn_ending_on_a_ready_engine_moves_nothing() -> None:
    async def go() -> None:
        mob, keeper, engines, _ = _mobility()
        engines["a"] = _rec("a", "ready")
        mob.after_turn("s", "a")
        await asyncio.sleep(0.1)
        assert keeper.moves == []

    asyncio.run(go())


def test_evacuation_and_the_turn_end_join_one_move() -> None:
    async def go() -> None:
        mob, keeper, _, _ = _mobility(delay=0.1)
        evac = asyncio.get_running_loop().create_task(mob.evacuate("a", "reloading"))
        await asyncio.sleep(0)
        mob.after_turn("s", "a")
        await evac
        assert keeper.moves == [("s", "b")]

    asyncio.run(go())


def test_no_target_serving_the_model_moves_nothing() -> None:
    async def go() -> None:
        mob, keeper, engines, _ = _mobility()
        engines["b"] = _rec("b", "ready", model="gemma3-270m")
        mob.after_turn("s", "a")
        await asyncio.sleep(0.1)
        assert keeper.moves == []

    asyncio.run(go())


def test_placements_into_one_engine_take_turns_and_other_engines_do_not_wait() -> None:
    async def go() -> None:
        places, order = Placements(), []

        async def place(engine: str, tag: str) -> None:
            async with places.lock(engine):
                order.append(f"{tag}+")
                await asyncio.sleep(0.05)
                order.append(f"{tag}-")

        await asyncio.gather(place("b", "1"), place("b", "2"), place("c", "3"))
        assert order.index("1-") < order.index("2+"), "two placements into b overlapped"
        assert order.index("3+") < order.index("1-"), "a placement into c waited for b"

    asyncio.run(go())


def test_no_kv_is_placed_into_an_engine_that_is_leaving() -> None:
    """A turn routed to an engine that is reloading prefills there: KV moved or restored into it would be
    dropped with its old generation a moment later."""
    async def go() -> None:
        mob, keeper, engines, affinity = _mobility()
        engines["a"], engines["b"] = _rec("a", "ready"), _rec("b", "reloading")
        assert await mob.restore("s", "b") is None
        assert keeper.moves == [] and keeper.restores == []

    asyncio.run(go())


def test_routing_counts_no_stored_kv_on_a_reloading_engine() -> None:
    from hydrad.coordinator.routing import EngineView, ModelSpec, RouteRequest, cost

    spec = {MODEL: ModelSpec(alias=MODEL, size_bytes=100_000_000, kv_bytes_per_token=23_040)}
    req = RouteRequest(model=MODEL, prompt_tokens=2000, session_id="s", stored_tokens=2000)
    common = {"alive": True, "model": MODEL, "prefill_tps": 300.0, "slots_total": 4, "models_on_disk": (MODEL,),
              "slots_busy": 0, "queued": 0}
    ready = EngineView(name="r", stage="ready", **common)
    reloading = EngineView(name="l", stage="reloading", **common)
    assert cost(req, ready, spec).lukewarm
    assert not cost(req, reloading, spec).lukewarm
    assert cost(req, reloading, spec).cost_s > cost(req, ready, spec).cost_s

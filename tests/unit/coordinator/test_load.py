"""What the coordinator believes an engine is running, between two heartbeats: a real bus (ZeroMQ
ROUTER on loopback) and a DEALER standing in for an engine, no model needed."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import zmq
import zmq.asyncio

from hydrad.wire import messages as M
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.settings import CoordinatorSettings
from tests.support.wait import eventually_async


async def _until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    await eventually_async(cond, timeout, what, interval=0.005)


def _done(req: str) -> M.Done:
    return M.Done(req=req, finish_reason="length", usage=M.UsageInfo(prompt_tokens=3, completion_tokens=1))


async def _scenario() -> dict[str, Any]:
    settings = CoordinatorSettings(bus={"endpoint": "tcp://127.0.0.1:*"}, events="tcp://127.0.0.1:*")
    bus = CoordinatorBus(settings, version="test")
    bus.start()
    ctx = zmq.asyncio.Context()
    engine = ctx.socket(zmq.DEALER)
    engine.setsockopt(zmq.IDENTITY, b"e1")
    engine.setsockopt(zmq.LINGER, 0)
    engine.connect(bus.bus_endpoint)
    out: dict[str, Any] = {}
    try:
        def status(busy: int, queued: int = 0) -> M.EngineStatus:
            return M.EngineStatus(stage="ready", model="m", slots_busy=busy, slots_total=1, queued=queued)

        await engine.send_multipart(M.encode(M.Register(engine="e1", instance="i.1", version="t", pid=1,
                                                        heartbeat_interval_s=60, status=status(0))))
        await _until(lambda: "e1" in bus.engines, "REGISTER")
        rec = bus.engines["e1"]

        # A bus request the next heartbeat counts as running...
        first = bus.generate("e1", M.Generate(req="gen-1", prompt="x"))
        await asyncio.sleep(0.01)
        await engine.send_multipart(M.encode(M.Heartbeat(status=status(1))))
        await _until(lambda: rec.status.slots_busy == 1, "the heartbeat")
        out["after_heartbeat"] = rec.heard_load()
        # ...ends: the engine is free at once, not a heartbeat later.
        await engine.send_multipart(M.encode(_done("gen-1")))
        await _until(lambda: first.finished, "DONE")
        out["after_done"] = rec.heard_load()

        # Another engine-side request (direct HTTP, say) in the heartbeat: a bus request that began
        # after that heartbeat and ended takes nothing off it.
        await engine.send_multipart(M.encode(M.Heartbeat(status=status(1, queued=1))))
        await _until(lambda: rec.status.queued == 1, "the second heartbeat")
        second = bus.generate("e1", M.Generate(req="gen-2", prompt="y"))
        await engine.send_multipart(M.encode(_done("gen-2")))
        await _until(lambda: second.finished, "DONE of gen-2")
        out["unrelated_done"] = rec.heard_load()

        # A stream the client abandons counts as ended too (the engine is told to cancel it).
        await engine.send_multipart(M.encode(M.Heartbeat(status=status(0))))
        third = bus.generate("e1", M.Generate(req="gen-3", prompt="z"))
        await asyncio.sleep(0.01)
        await engine.send_multipart(M.encode(M.Heartbeat(status=status(1))))
        await _until(lambda: rec.status.slots_busy == 1 and rec.status_at > third.t0, "the third heartbeat")
        bus.cancel(third)
        out["after_cancel"] = rec.heard_load()
        cancel = await asyncio.wait_for(engine.recv_multipart(), 5)
        while M.decode(cancel).KIND != b"CANCEL":
            cancel = await asyncio.wait_for(engine.recv_multipart(), 5)
        out["cancel_sent"] = True
    finally:
        engine.close(0)
        ctx.term()
        await bus.close()
    return out


def test_a_finished_request_frees_its_engine_before_the_next_heartbeat() -> None:
    out = asyncio.run(_scenario())
    assert out == {"after_heartbeat": 1, "after_done": 0, "unrelated_done": 2, "after_cancel": 0,
                   "cancel_sent": True}

"""An engine is declared down for silence the coordinator listened through, not for a pass that held
the coordinator's own loop: its heartbeats then wait unread in the socket. A real ROUTER on loopback,
and an engine stand-in on a thread of its own that heartbeats every 0.1 s throughout."""

from __future__ import annotations

import asyncio
import threading
import time

import zmq

from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.wire import messages as M

INTERVAL = 0.1  # the engine's declared interval: 3 of them (0.3 s) of silence is down


def _engine(endpoint: str, stop: threading.Event) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"e1~0001")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    status = M.EngineStatus(stage="ready", model="m", slots_total=1)
    sock.send_multipart(M.encode(M.Register(engine="e1", instance="i.1", version="t", pid=1,
                                            heartbeat_interval_s=INTERVAL, status=status)))
    while not stop.is_set():
        time.sleep(INTERVAL)
        sock.send_multipart(M.encode(M.Heartbeat(status=status)))
        while sock.poll(0):
            sock.recv_multipart()
    ctx.destroy(0)


async def _held_then_listening() -> tuple[bool, bool, bool]:
    bus = CoordinatorBus(CoordinatorSettings(bus={"endpoint": "tcp://127.0.0.1:*"}, events="tcp://127.0.0.1:*",
                                             heartbeat_interval_s=INTERVAL), version="test")
    bus.load_token()
    bus.start()
    stop = threading.Event()
    engine = threading.Thread(target=_engine, args=(bus.bus_endpoint, stop), daemon=True)
    engine.start()
    try:
        for _ in range(100):
            if "e1" in bus.engines and bus.engines["e1"].alive:
                break
            await asyncio.sleep(0.05)
        registered = "e1" in bus.engines and bus.engines["e1"].alive
        time.sleep(1.0)  # the coordinator's loop held for 10 of the engine's intervals
        await asyncio.sleep(0.5)  # then listening again: the queued heartbeats are read
        alive_after_hold = bus.engines["e1"].alive
        stop.set()
        engine.join(5)
        await asyncio.sleep(0.8)  # real silence, listened through: down
        return registered, alive_after_hold, not bus.engines["e1"].alive
    finally:
        stop.set()
        await bus.close()


def test_a_held_coordinator_loop_declares_no_engine_down() -> None:
    registered, alive_after_hold, down_after_silence = asyncio.run(_held_then_listening())
    assert registered
    assert alive_after_hold, "declared down for heartbeats that waited unread while the loop was held"
    assert down_after_silence, "a silent engine must still go down"

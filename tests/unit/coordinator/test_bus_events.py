"""The coordinator's event socket builds and sends an event only while a console subscribes, and a
console that subscribes gets every event from then on, as from a plain PUB. A real XPUB and real SUB
sockets on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.wire import eventsauth
from hydrad.wire.busevents import Event


def test_events_go_only_while_a_console_listens(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        bus = CoordinatorBus(CoordinatorSettings(bus={"endpoint": "tcp://127.0.0.1:*"}, events="tcp://127.0.0.1:*"),
                             version="test")
        bus.start()
        ctx = zmq.asyncio.Context()
        out: dict[str, Any] = {"before": bus._listened()}
        try:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"route")
            eventsauth.present(sub, bus.events_door.token)
            sub.connect(bus.events_endpoint)
            for _ in range(200):  # the subscription reaches the XPUB asynchronously
                if bus._listened():
                    break
                await asyncio.sleep(0.01)
            out["subscribed"] = bus._listened()
            bus.publish("route", req="r1")
            bus.publish("engine.up", engine="e")  # a topic nobody asked for: filtered by the socket
            bus.publish("route", req="r2")
            got = []
            while await sub.poll(500):
                got.append(Event.from_frames(await sub.recv_multipart()))
            out["got"] = [(e.topic, e.data["req"]) for e in got]
            sub.close(linger=0)
            for _ in range(200):  # a console that goes away unsubscribes
                if not bus._listened():
                    break
                await asyncio.sleep(0.01)
            out["after"] = bus._listened()
        finally:
            ctx.destroy(0)
            await bus.close()
        return out

    out = asyncio.run(scenario())
    assert out == {"before": False, "subscribed": True, "got": [("route", "r1"), ("route", "r2")], "after": False}

"""How a coordinator offers its request stream (``bus.request_stream``): WELCOME keeps the members an
engine of an earlier release decodes (it refuses a member it does not know, and would then never
count itself admitted), and the endpoint follows in a STREAM message of its own, a kind such an
engine drops with a warning. A real ROUTER on loopback and a raw DEALER standing in for the engine
(no model needed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from hydrad.common.netaccess import split_endpoint
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.wire import messages as M
from tests.support.engine import free_port


async def _welcome_and_after(stream: str | None) -> list[list[bytes]]:
    """The raw messages a registering engine receives within 0.5 s (``stream`` None: the default)."""
    bus_settings: dict[str, object] = {"endpoint": "tcp://127.0.0.1:*"}
    if stream is not None:
        bus_settings["request_stream"] = stream
    bus = CoordinatorBus(CoordinatorSettings(bus=bus_settings, events="tcp://127.0.0.1:*"), version="test")
    bus.load_token()
    bus.start()
    ctx = zmq.asyncio.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"e1~0001")
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(bus.bus_endpoint)
        await sock.send_multipart(M.encode(M.Register(
            engine="e1", instance="i.1", version="t", pid=1, heartbeat_interval_s=60,
            status=M.EngineStatus(stage="ready", model="m", slots_total=1))))
        out: list[list[bytes]] = []
        while await sock.poll(500):
            out.append(await sock.recv_multipart())
        return out
    finally:
        ctx.destroy(0)
        await bus.close()


def test_welcome_keeps_its_earlier_members_and_the_stream_comes_apart(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    got = asyncio.run(_welcome_and_after(endpoint))
    kinds = [frames[1] for frames in got]
    assert kinds[:2] == [M.Welcome.KIND, M.StreamOffer.KIND], kinds
    assert set(json.loads(got[0][2])) == {"coordinator", "version"}  # what every earlier engine decodes
    offer = M.decode(got[1])
    assert isinstance(offer, M.StreamOffer) and offer.endpoint == endpoint


def test_no_stream_offer_without_a_request_stream(tmp_path: Path) -> None:
    got = asyncio.run(_welcome_and_after("off"))
    kinds = [frames[1] for frames in got]
    assert kinds and kinds[0] == M.Welcome.KIND and M.StreamOffer.KIND not in kinds, kinds


def test_a_default_pool_offers_its_stream_at_the_port_it_got() -> None:
    """``auto``: a bus on a free port (ZeroMQ's ``*``) gets a stream on a free port too, and the offer
    names the port the listener was given, not 0."""
    got = asyncio.run(_welcome_and_after(None))
    offer = M.decode(got[1])
    assert isinstance(offer, M.StreamOffer), got
    host, port = split_endpoint(offer.endpoint)
    assert host == "127.0.0.1" and port > 0


@pytest.mark.parametrize("endpoint", ["", "no-port", "host:", ":9502", "host:0", "host:65536", "host:x1"])
def test_an_offer_the_engine_could_not_use_is_a_malformed_message(endpoint: str) -> None:
    """Refused where bytes become messages, so the engine's link drops it with its usual warning and
    never starts a stream task that would fail on it."""
    frames = [M.PROTOCOL, M.StreamOffer.KIND, json.dumps({"endpoint": endpoint}).encode()]
    with pytest.raises(M.BusDecodeError):
        M.decode(frames)

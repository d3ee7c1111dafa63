"""Where the request stream listens by default (``bus.request_stream: auto``), and what happens when it
cannot: a default pool must start whatever else holds the port, while an endpoint the operator named
must not be quietly dropped. Real sockets on loopback; no model needed."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
import zmq
from pydantic import ValidationError

from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.settings import BusSettings, CoordinatorSettings
from hydrad.engine.bus.stream import EngineStream
from tests.support.engine import free_port


@pytest.mark.parametrize(("bus", "plan"), [
    ({}, ("127.0.0.1:9502", False)),  # the default bus, tcp://127.0.0.1:9500
    ({"endpoint": "tcp://*:9500"}, ("*:9502", False)),
    ({"endpoint": "tcp://10.1.2.3:7000"}, ("10.1.2.3:7002", False)),
    ({"endpoint": "tcp://127.0.0.1:0"}, ("127.0.0.1:0", False)),
    ({"endpoint": "tcp://127.0.0.1:*"}, ("127.0.0.1:0", False)),
    ({"endpoint": "tcp://127.0.0.1:65534"}, None),  # no port + 2 to take
    ({"endpoint": "ipc:///run/hydra/bus"}, None),  # no TCP host to listen beside
    ({"request_stream": "off"}, None),
    ({"request_stream": None}, None),
    ({"request_stream": "127.0.0.1:7777"}, ("127.0.0.1:7777", True)),
])
def test_where_the_stream_listens(bus: dict[str, object], plan: tuple[str, bool] | None) -> None:
    assert BusSettings(**bus).stream_plan() == plan


def test_curve_turns_the_default_off_and_refuses_an_explicit_stream() -> None:
    keys = {"curve_public_key": "a" * 40, "curve_secret_key": "b" * 40}
    assert BusSettings(**keys).stream_plan() is None
    with pytest.raises(ValidationError, match="not encrypted"):
        BusSettings(**keys, request_stream="127.0.0.1:7777")


@pytest.mark.parametrize("value", ["on", "127.0.0.1", "127.0.0.1:0", "host:99999"])
def test_a_bad_value_names_the_setting(value: str) -> None:
    with pytest.raises(ValidationError, match="request_stream"):
        BusSettings(request_stream=value)


def _held_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def test_a_taken_default_port_leaves_requests_on_the_bus(caplog: pytest.LogCaptureFixture) -> None:
    """The port after next of a free bus port is held by someone else: the coordinator starts, warns
    and offers no stream."""
    async def run() -> None:
        for _ in range(20):  # find a bus port whose + 2 we can hold
            bus_port = free_port()
            try:
                holder = socket.socket()
                holder.bind(("127.0.0.1", bus_port + 2))
                holder.listen(1)
                break
            except OSError:
                holder.close()
        else:
            pytest.fail("no bus port with a free port + 2 in 20 tries")
        try:
            bus = CoordinatorBus(CoordinatorSettings(bus=f"tcp://127.0.0.1:{bus_port}", events="tcp://127.0.0.1:*"),
                                 version="test")
            bus.load_token()
            with caplog.at_level(logging.WARNING, logger="hydra.coordinator.bus"):
                bus.start()
            try:
                assert bus.request_stream is None
                warned = [r for r in caplog.records if r.getMessage().startswith("request stream not started")]
                assert warned and warned[0].fields["endpoint"] == f"127.0.0.1:{bus_port + 2}"  # type: ignore[attr-defined]
            finally:
                await bus.close()
        finally:
            holder.close()

    asyncio.run(run())


def test_a_taken_explicit_port_stops_the_start() -> None:
    async def run() -> None:
        holder, port = _held_port()
        try:
            bus = CoordinatorBus(CoordinatorSettings(
                bus={"endpoint": "tcp://127.0.0.1:*", "request_stream": f"127.0.0.1:{port}"},
                events="tcp://127.0.0.1:*"), version="test")
            bus.load_token()
            with pytest.raises(zmq.ZMQError, match=f"request_stream 127.0.0.1:{port}"):
                bus.start()
        finally:
            holder.close()

    asyncio.run(run())


@pytest.mark.parametrize(("offer", "bus", "target"), [
    ("*:9502", "tcp://10.1.2.3:9500", ("10.1.2.3", 9502)),
    ("0.0.0.0:9502", "tcp://gpu-host:9500", ("gpu-host", 9502)),
    ("[::]:9502", "tcp://[fd00::1]:9500", ("fd00::1", 9502)),
    ("10.9.9.9:7002", "tcp://10.1.2.3:9500", ("10.9.9.9", 7002)),  # a host named in the offer is used as is
])
def test_an_engine_connects_to_a_wildcard_stream_where_it_reaches_the_bus(
        offer: str, bus: str, target: tuple[str, int]) -> None:
    s = EngineStream(offer, b"e~1", None, 1.0, lambda m: None, lambda: None, lambda *a, **k: None, bus_endpoint=bus)
    assert s._target() == target


def test_what_one_pass_sends_on_a_stream_leaves_in_one_write() -> None:
    """A burst the front door's gate released together goes out in one write, so the engine reads it at
    once and starts one step with all of it (tests/integration/test_coordinator.py has the step count).
    A real socket pair; the writer's write is counted, and what arrives is read back message by message."""
    from hydrad.coordinator.reqstream import RequestStreamDoor
    from hydrad.wire import messages as M
    from hydrad.wire import streamframes as SF

    async def run() -> None:
        a, b = socket.socketpair()
        _, writer = await asyncio.open_connection(sock=a)
        reader, far = await asyncio.open_connection(sock=b)
        writes: list[int] = []
        write = writer.write
        writer.write = lambda data: (writes.append(len(data)), write(data))[1]  # type: ignore[method-assign]
        door = RequestStreamDoor(bus=None, endpoint="127.0.0.1:0")
        door._links[b"e~1"] = writer
        sent = [[M.PROTOCOL, M.Cancel.KIND, f'{{"req": "r{i}"}}'.encode()] for i in range(4)]
        for frames in sent:
            assert door.send(b"e~1", "e", frames)
        assert writes == []  # nothing leaves inside the pass that queued it
        await asyncio.sleep(0)
        assert len(writes) == 1
        got = [await asyncio.wait_for(SF.read(reader), 5) for _ in sent]
        assert got == sent and door.stats["sent"] == 4
        writer.close()
        far.close()

    asyncio.run(run())

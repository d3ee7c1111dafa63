"""``EventStream`` behind the daemons' own uvicorn server, over a real loopback socket: each event
leaves as it is yielded, a client that hangs up mid-stream ends the body iterator at once (its
``finally`` is where a request is cancelled on its engine), and the server goes on serving."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from hydrad.common.eventstream import EventStream
from hydrad.common.serving import uvicorn_server
from tests.support.engine import free_port
from tests.support.wait import eventually


class Probe:
    """What the app saw, written on the server's loop and read by the test."""

    def __init__(self) -> None:
        self.release: asyncio.Event | None = None
        self.closed = threading.Event()
        self.leftover_cancels: list[int] = []


@pytest.fixture
def served() -> Iterator[tuple[int, Probe, Any]]:
    probe = Probe()

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"data: one\n\n"
            assert probe.release is not None
            await probe.release.wait()  # never set unless the test says so: a stream still running
            yield b"data: two\n\n"
        finally:
            probe.closed.set()

    async def stream(request: Request) -> EventStream:
        probe.release = asyncio.Event()
        return EventStream(events())

    class After:
        """A bare ASGI app: the answer, then more work in the same task once it has ended."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def one() -> AsyncIterator[bytes]:
                yield b"data: done\n\n"
            await EventStream(one())(scope, receive, send)
            task = asyncio.current_task()
            assert task is not None
            await asyncio.sleep(0.05)  # a cancellation left pending by the stream would land here
            probe.leftover_cancels.append(task.cancelling())

    port = free_port()
    server = uvicorn_server(Starlette(routes=[Route("/stream", stream), Route("/after", After())]), "127.0.0.1", port)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    eventually(lambda: server.started, 10, "the server to start", interval=0.01)
    try:
        yield port, probe, loop
    finally:
        server.should_exit = True
        thread.join(10)


def _get(port: int, path: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def _read_until(s: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before {marker!r}; got {got!r}"
        got += chunk
    return got


def test_an_event_leaves_before_the_next_is_ready(served: tuple[int, Probe, Any]) -> None:
    port, probe, loop = served
    s = _get(port, "/stream")
    head = _read_until(s, b"data: one\n\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    assert not probe.closed.is_set()
    loop.call_soon_threadsafe(lambda: probe.release.set())  # type: ignore[union-attr]
    rest = _read_until(s, b"0\r\n\r\n")  # the chunked body's end: the stream ended whole
    assert b"data: two\n\n" in rest
    assert probe.closed.wait(5)
    s.close()


def test_a_client_that_hangs_up_mid_stream_ends_the_iterator_at_once(served: tuple[int, Probe, Any]) -> None:
    port, probe, _ = served
    s = _get(port, "/stream")
    _read_until(s, b"data: one\n\n")
    s.close()
    assert probe.closed.wait(5), "the body iterator was left running after its client hung up"
    s2 = _get(port, "/stream")  # the server goes on serving
    assert _read_until(s2, b"data: one\n\n").startswith(b"HTTP/1.1 200")
    s2.close()


def test_a_finished_stream_leaves_no_cancellation_behind(served: tuple[int, Probe, Any]) -> None:
    port, probe, _ = served
    s = _get(port, "/after")
    _read_until(s, b"data: done\n\n")
    s.close()
    eventually(lambda: probe.leftover_cancels, 5, "the app's work after the answer", interval=0.01)
    assert probe.leftover_cancels == [0]

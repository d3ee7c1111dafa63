"""The engine's bus link sends the stream messages queued in one pass of its event loop as one batch
(one send a step instead of one per request), in order; a batch that cannot go cancels its requests, as
a failed send of their own would. A real DEALER (the link's own socket) and a real ROUTER on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from hydrad.common.registry import Registry
from hydrad.engine.bus.link import EngineLink
from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.engine.settings import EngineSettings
from hydrad.wire import messages as M

STREAM = [M.Tokens(req="g-1", texts=["a"]), M.Tokens(req="g-2", texts=["b", "c"]),
          M.Done(req="g-1", finish_reason="length", usage=M.UsageInfo(prompt_tokens=1, completion_tokens=1)),
          M.Error(req="g-3", message="x", status=500, code="internal_error")]


def _link(endpoint: str) -> EngineLink:
    control = EngineControl(EngineCore(), Registry.load(None, Path(".")), {})
    return EngineLink(EngineSettings(name="t", bus={"endpoint": endpoint}), control, http=None, rpc=None)


def test_one_pass_of_stream_messages_goes_as_one_batch() -> None:
    async def scenario() -> list[list[bytes]]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = _link(f"tcp://127.0.0.1:{port}")
        try:
            link._open()
            for _ in range(200):  # any message, once the connection is up (IMMEDIATE: no queueing before)
                if link._send(M.Ping()):
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait_for(router.recv_multipart(), 10)
            assert all(link._queue(m) for m in STREAM)  # one pass of the loop: nothing sent yet
            assert len(link._outbox) == len(STREAM)
            got = [await asyncio.wait_for(router.recv_multipart(), 10)]
            await asyncio.sleep(0.2)
            while await router.poll(0):
                got.append(await router.recv_multipart())
            return got
        finally:
            link._sock.close(linger=0)  # type: ignore[union-attr]
            router.close(linger=0)
            link._ctx.term()
            ctx.term()

    got = asyncio.run(scenario())
    assert len(got) == 1, f"{len(got)} sends for one pass of the loop"
    assert M.decode_all(got[0][1:]) == STREAM


def test_a_batch_that_cannot_go_cancels_its_requests() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        link = _link("tcp://127.0.0.1:9")  # nothing listens: with IMMEDIATE set the send would block
        try:
            link._open()
            link._welcomed = True
            waiting = {req: asyncio.create_task(asyncio.sleep(60)) for req in ("g-1", "g-2")}
            link._inflight.update(waiting)
            queued = link._queue(STREAM[0]) and link._queue(STREAM[1])
            await asyncio.sleep(0.05)
            return queued, all(t.cancelled() for t in waiting.values()), not link._inflight
        finally:
            link._sock.close(linger=0)  # type: ignore[union-attr]
            link._ctx.term()

    queued, cancelled, forgotten = asyncio.run(scenario())
    assert queued and cancelled and forgotten


def test_nothing_is_queued_without_a_connection() -> None:
    async def scenario() -> tuple[bool, int]:
        link = _link("tcp://127.0.0.1:9")
        return link._queue(STREAM[0]), len(link._outbox)

    assert asyncio.run(scenario()) == (False, 0)


def test_a_request_answers_the_way_its_generate_came() -> None:
    """Requests that came on the request stream answer on it, the others on the bus, both in one pass; a
    stream request whose stream is down is cancelled, never sent on the bus (the two keep no order)."""
    from hydrad.engine.bus.stream import EngineStream
    from hydrad.wire import streamframes as SF

    async def scenario() -> tuple[list[M.Message], list[M.Message], bool]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
        server = await asyncio.start_server(lambda r, w: accepted.put_nowait(r), "127.0.0.1", 0)
        link = _link(f"tcp://127.0.0.1:{port}")
        try:
            link._open()
            for _ in range(200):
                if link._send(M.Ping()):
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait_for(router.recv_multipart(), 10)
            stream = EngineStream("127.0.0.1:1", b"t~x", None, 1.0, link._dispatch_streamed, link._cancel_all, link._warn)
            _, stream._writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            link._stream = stream
            link._dispatch_streamed(M.Generate(req="g-1", prompt="x"))  # came on the stream
            link._dispatch(M.Generate(req="g-2", prompt="y"))  # came on the bus
            for task in list(link._inflight.values()):
                task.cancel()  # the core is not serving: only the ways out are looked at here
            link._inflight.update({"g-1": asyncio.create_task(asyncio.sleep(60)),
                                   "g-2": asyncio.create_task(asyncio.sleep(60))})
            assert link._queue(STREAM[0]) and link._queue(STREAM[1]) and link._queue(STREAM[2])
            reader = await asyncio.wait_for(accepted.get(), 10)
            on_stream = M.decode_all(await asyncio.wait_for(SF.read(reader), 10))
            on_bus = M.decode_all((await asyncio.wait_for(router.recv_multipart(), 10))[1:])
            stream._writer.close()
            await asyncio.sleep(0.05)
            waiting = link._inflight["g-1"]
            link._queue(M.Tokens(req="g-1", texts=["late"]))
            await asyncio.sleep(0.05)
            quiet = not await router.poll(100)
            return on_stream, on_bus, waiting.cancelled() and quiet
        finally:
            link._sock.close(linger=0)  # type: ignore[union-attr]
            router.close(linger=0)
            server.close()
            link._ctx.term()
            ctx.term()

    on_stream, on_bus, cancelled_not_rerouted = asyncio.run(scenario())
    assert on_stream == [STREAM[0], STREAM[2]]  # g-1's tokens and DONE, in order
    assert on_bus == [STREAM[1]]  # g-2's
    assert cancelled_not_rerouted


def test_a_generate_the_engine_cannot_read_fails_its_request_at_once() -> None:
    """A GENERATE whose body does not decode (a field of another release, a value out of bounds) is
    answered with a 400 ERROR for its request, not dropped for the coordinator to wait on."""
    async def scenario() -> M.Message:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = _link(f"tcp://127.0.0.1:{port}")
        link.start()
        try:
            ident, *_ = await asyncio.wait_for(router.recv_multipart(), 10)  # REGISTER
            await router.send_multipart([ident, *M.encode(M.Welcome(coordinator="c", version="t"))])
            await router.send_multipart([ident, M.PROTOCOL, M.Generate.KIND,
                                         b'{"req":"g-bad","prompt":"x","sampling":{"logit_bias":[[1,1e300]]}}'])
            while True:
                frames = await asyncio.wait_for(router.recv_multipart(), 10)
                for msg in M.decode_all(frames[1:]):
                    if isinstance(msg, M.Error):
                        return msg
        finally:
            await link.close()
            router.close(linger=0)
            ctx.term()

    err = asyncio.run(scenario())
    assert isinstance(err, M.Error) and err.req == "g-bad" and err.status == 400 and "logit_bias" in err.message, err

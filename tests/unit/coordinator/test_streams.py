"""A request's stream inside the coordinator: the waits of ``RequestStream.next`` and the SSE writes of
the front door's stream (``answers.BusEvents`` read by ``answering.stream`` through a renderer: events
already waiting leave in one write, events arriving one by one in one write each)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hydrad.wire import answering
from hydrad.coordinator.answers import BusEvents
from hydrad.coordinator.records import EngineLost, RequestStream
from hydrad.wire import messages as M
from hydrad.wire.render import CompletionAnswer


class _Bus:
    """What relay needs of the bus: cancel, counted (a real bus needs a ZeroMQ socket and engines)."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, stream: RequestStream) -> None:
        self.cancelled.append(stream.req)


def _tokens(text: str) -> M.Tokens:
    return M.Tokens(req="r1", texts=[text])


def _done() -> M.Done:
    return M.Done(req="r1", finish_reason="length", usage=M.UsageInfo(prompt_tokens=3, completion_tokens=3))


def relay(bus: _Bus, stream: RequestStream, first: Any, record: Any) -> Any:
    """The front door's stream of a /v1/completions request whose first event was ``first``."""
    source = BusEvents(bus, stream, 5.0, "e1", "cmpl-1", retry_lost=False)
    return answering.stream(source, CompletionAnswer("m", "fp"), source.event(first), record)


def _events(writes: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for w in writes:
        for block in w.decode().split("\n\n"):
            if block:
                assert block.startswith("data: ")
                body = block[len("data: "):]
                out.append(body if body == "[DONE]" else json.loads(body))
    return out


async def _relay_all(stream: RequestStream, first: Any, bus: _Bus, *, feed: list[Any] | None = None) -> list[bytes]:
    """Every write relay makes; ``feed`` events are pushed one at a time, each after relay has waited."""
    recorded: list[str] = []
    writes: list[bytes] = []
    gen = relay(bus, stream, first, lambda text, done: recorded.append(text))
    feed = list(feed or [])

    async def feeder() -> None:
        while feed:
            await asyncio.sleep(0.01)
            stream.push(feed.pop(0))

    task = asyncio.create_task(feeder())
    async for w in gen:
        writes.append(w)
    await task
    assert recorded, "the finished turn was recorded"
    return writes


def test_next_returns_what_was_pushed_and_times_out_to_none() -> None:
    async def main() -> None:
        s = RequestStream("r1", "e1")
        s.push(_tokens("a"))
        assert s.ready()
        ev = await s.next(1.0)
        assert isinstance(ev, M.Tokens) and ev.texts == ["a"]
        assert not s.ready()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await s.next(0.05) is None
        assert 0.04 <= loop.time() - t0 < 1.0
        later = loop.call_later(0.02, s.push, _tokens("b"))
        ev = await s.next(5.0)
        assert isinstance(ev, M.Tokens) and ev.texts == ["b"]
        later.cancel()

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_stream_usable() -> None:
    async def main() -> None:
        s = RequestStream("r1", "e1")
        waiting = asyncio.create_task(s.next(5.0))
        await asyncio.sleep(0.01)
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        s.push(_tokens("x"))
        s.push(EngineLost("gone"))
        assert s.finished
        assert isinstance(await s.next(1.0), M.Tokens)
        assert isinstance(await s.next(1.0), EngineLost)

    asyncio.run(main())


def test_events_already_waiting_leave_in_one_write() -> None:
    async def main() -> list[bytes]:
        s = RequestStream("r1", "e1")
        for t in ("b", "c", "d"):
            s.push(_tokens(t))
        s.push(_done())
        return await _relay_all(s, _tokens("a"), _Bus())

    writes = asyncio.run(main())
    assert len(writes) == 1, writes
    events = _events(writes)
    assert [e["choices"][0]["text"] for e in events[:-2]] == ["a", "b", "c", "d"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"


def test_events_arriving_one_by_one_leave_one_write_each() -> None:
    async def main() -> list[bytes]:
        s = RequestStream("r1", "e1")
        return await _relay_all(s, _tokens("a"), _Bus(), feed=[_tokens("b"), _tokens("c"), _done()])

    writes = asyncio.run(main())
    assert len(writes) == 4, writes  # a, b, c, then finish + [DONE] together
    assert [e["choices"][0]["text"] for e in _events(writes[:3])] == ["a", "b", "c"]
    assert _events(writes[3:])[-1] == "[DONE]"


def test_an_engine_lost_mid_stream_ends_with_the_tokens_before_it_and_an_error() -> None:
    async def main() -> tuple[list[bytes], _Bus]:
        s = RequestStream("r1", "e1")
        s.push(_tokens("b"))
        s.push(EngineLost("the engine died"))
        bus = _Bus()
        writes: list[bytes] = []
        async for w in relay(bus, s, _tokens("a"), lambda *a: None):
            writes.append(w)
        return writes, bus

    writes, bus = asyncio.run(main())
    events = _events(writes)
    assert [e["choices"][0]["text"] for e in events[:2]] == ["a", "b"]
    assert events[2]["error"]["code"] == "engine_failed"
    assert "the engine died" in events[2]["error"]["message"]
    assert events[-1] == "[DONE]"
    assert bus.cancelled == []  # the stream had finished: nothing to cancel

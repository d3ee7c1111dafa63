"""The front door's burst gate (hydrad/coordinator/burst.py): requests that arrive together are released
together, a lone request waits only a few passes of the event loop, and no request waits without bound."""

from __future__ import annotations

import asyncio

import pytest

from hydrad.coordinator.burst import GATHER_PASSES, MAX_PASSES, MIN_PASSES, BurstGate


class Passes:
    """Counts passes of the running event loop (a callback that requeues itself once per pass)."""

    def __init__(self) -> None:
        self.n = 0
        self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.n += 1
        self._loop.call_soon(self._tick)


async def passes_to_send(gate: BurstGate, passes: Passes) -> int:
    """A request that arrives now and is ready at once: the passes it waits before it may send."""
    with gate.arrival() as a:
        t0 = passes.n
        await a.ready()
        return passes.n - t0


async def _yield(passes: int) -> None:
    for _ in range(passes):
        await asyncio.sleep(0)


def test_a_lone_request_waits_the_minimum_passes_only() -> None:
    async def main() -> tuple[int, int]:
        gate, passes = BurstGate(), Passes()
        waited = await passes_to_send(gate, passes)
        return waited, gate.on_way

    waited, on_way = asyncio.run(main())
    assert MIN_PASSES <= waited <= MIN_PASSES + 1, waited
    assert on_way == 0


def test_a_burst_is_released_together_once_the_last_is_ready() -> None:
    """Three requests arrive together but become ready one, three and five passes later (parsing and
    routing take passes): all three leave in the same pass, after the slowest is ready."""

    async def request(gate: BurstGate, passes: Passes, delay: int, sent: list[tuple[int, int]]) -> None:
        with gate.arrival() as a:
            await _yield(delay)
            await a.ready()
            sent.append((delay, passes.n))

    async def main() -> tuple[list[tuple[int, int]], int]:
        gate, passes, sent = BurstGate(), Passes(), []
        await asyncio.gather(*(request(gate, passes, d, sent) for d in (1, 3, 5)))
        return sent, gate.on_way

    sent, on_way = asyncio.run(main())
    assert sorted(d for d, _ in sent) == [1, 3, 5]
    assert len({p for _, p in sent}) == 1, sent  # one pass: back to back
    assert on_way == 0


def test_a_request_that_stays_on_its_way_holds_the_others_a_bounded_number_of_passes() -> None:
    """One request waits on something long (a model loading, a KV move): a ready one is sent after at
    most MAX_PASSES passes anyway, and the slow one, once ready, goes by itself."""

    async def main() -> tuple[int, int, int]:
        gate, passes = BurstGate(), Passes()
        slow_may_go = asyncio.Event()

        async def slow() -> int:
            with gate.arrival() as a:
                await slow_may_go.wait()
                t0 = passes.n
                await a.ready()
                return passes.n - t0

        slow_task = asyncio.ensure_future(slow())
        await asyncio.sleep(0)
        fast_waited = await passes_to_send(gate, passes)
        on_way_meanwhile = gate.on_way
        slow_may_go.set()
        return fast_waited, await slow_task, on_way_meanwhile

    fast_waited, slow_waited, on_way_meanwhile = asyncio.run(main())
    assert MAX_PASSES <= fast_waited <= MAX_PASSES + 1, fast_waited
    assert on_way_meanwhile == 1  # the slow one still counts until it sends or fails
    assert slow_waited <= MIN_PASSES + 1, slow_waited


def test_requests_arriving_after_the_burst_do_not_hold_it() -> None:
    """Under a steady flood every pass of a busy loop brings new requests. A burst (A ready at once, B
    parsed and routed for 12 passes) waits for B, but not for L, which arrived once A's burst had
    stopped gathering and stays on its way far longer: A and B leave together as soon as B is ready."""

    async def main() -> tuple[int, int, int]:
        gate, passes = BurstGate(min_passes=3, max_passes=40), Passes()
        out: dict[str, int] = {}

        async def request(name: str, start: int, work: int) -> None:
            await _yield(start)
            with gate.arrival() as a:
                await _yield(work)
                await a.ready()
                out[name] = passes.n

        t0 = passes.n
        await asyncio.gather(request("A", 0, 0), request("B", 0, 12), request("L", GATHER_PASSES + 2, 30))
        return out["A"] - t0, out["B"] - t0, out["L"] - t0

    a, b, late = asyncio.run(main())
    assert a == b, (a, b)  # one burst
    assert b <= 12 + 3, b  # released once B was ready, not at the bound (40)
    assert late > b


def test_a_request_arriving_while_the_burst_gathers_joins_it() -> None:
    """A request counted one pass after the first is ready (read by the same poll, parsed later) is part
    of the burst: the first waits for it and both leave in the same pass."""

    async def main() -> list[tuple[str, int]]:
        gate, passes, sent = BurstGate(), Passes(), []

        async def second() -> None:
            await _yield(1)
            with gate.arrival() as a:
                await _yield(MIN_PASSES + 3)
                await a.ready()
                sent.append(("second", passes.n))

        task = asyncio.ensure_future(second())
        with gate.arrival() as a:
            await a.ready()
            sent.append(("first", passes.n))
        await task
        return sent

    sent = asyncio.run(main())
    assert [name for name, _ in sent] == ["first", "second"]
    assert sent[0][1] == sent[1][1], sent


def test_a_cancelled_or_failed_request_leaves_the_count_and_frees_the_others() -> None:
    async def main() -> tuple[int, int]:
        gate, passes = BurstGate(), Passes()
        parked = asyncio.Event()

        async def goes_away() -> None:
            with gate.arrival():
                parked.set()
                await asyncio.sleep(3600)  # a client gone before its request was routed

        async def fails() -> None:
            with gate.arrival():
                raise ValueError("bad request")

        gone = asyncio.ensure_future(goes_away())
        await parked.wait()
        with pytest.raises(ValueError):
            await fails()
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        waited = await passes_to_send(gate, passes)
        return waited, gate.on_way

    waited, on_way = asyncio.run(main())
    assert waited <= MIN_PASSES + 1, waited
    assert on_way == 0


def test_a_request_cancelled_while_held_leaves_the_count() -> None:
    async def main() -> int:
        gate = BurstGate()

        async def held() -> None:
            with gate.arrival() as a:
                await a.ready()

        with gate.arrival():  # keeps the held one waiting until it is cancelled
            task = asyncio.ensure_future(held())
            await _yield(2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            n = gate.on_way
        assert n == 1
        return gate.on_way

    assert asyncio.run(main()) == 0


def test_a_retry_is_sent_at_once() -> None:
    """After its first send a request is off the count: a second attempt (another engine) does not wait."""

    async def main() -> bool:
        gate = BurstGate()
        with gate.arrival() as a:
            await a.ready()
            coro = a.ready()
            try:
                coro.send(None)
            except StopIteration:
                return True
            coro.close()
            return False

    assert asyncio.run(main())

"""Requests that reach the front door together leave for their engines together.

An engine gathers the requests that arrive in one pass of its event loop into one step (its
hand-over, ``EngineCore.submit``): eight prompts sent at once are prefilled in one batch. Straight
to an engine's HTTP port that happens by itself, since its server parses the eight requests in
one pass. Through the coordinator it did not: the front door parses, routes and sends each request
in turn, so GENERATE messages left a few hundred microseconds apart (1–1.5 ms on a 2-core machine),
the engine's hand-over closed on the first alone, and it prefilled that prompt while the other
seven waited a whole step. Eight streams then streamed 5–9 % slower through the coordinator than
direct, all of it from that first lone step (measured with the engine's ``llama_decode`` count:
33 calls for 8 streams of 32 tokens through, 32 direct).

So a request that is ready to send while others that arrived with it are still being parsed or
routed waits for them, and the whole burst is sent back to back. The wait is bounded in passes of
the event loop (a request may stay on its way for long: a model loading, a session's KV moving),
and a request waits at least ``MIN_PASSES`` passes: a request whose last byte arrives while the
first is being routed is parsed, and counted, only two passes after the poll that read it. A lone
request pays those passes (microseconds each on an idle loop) and nothing more.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

MIN_PASSES = 3  # passes a ready request waits at least: a request read in the first is counted in the third
MAX_PASSES = 10  # passes of the event loop a ready request waits for the rest of its burst at most


class BurstGate:
    """Counts requests between their arrival and their send; releases the ready ones together."""

    def __init__(self, min_passes: int = MIN_PASSES, max_passes: int = MAX_PASSES) -> None:
        self.min_passes = min_passes
        self.max_passes = max_passes
        self.on_way = 0  # arrived and neither sent nor given up
        self._held: list[asyncio.Future[None]] = []

    def arrival(self) -> "Arrival":
        """A request's place in the gate, from its arrival until it is sent or fails (a context manager)."""
        return Arrival(self)

    def _hold(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._held.append(fut)
        if len(self._held) == 1:
            loop.call_soon(self._check, 1)
        return fut

    def _check(self, passes: int) -> None:
        """Release the held requests once none other is on its way (after ``min_passes``), or after
        ``max_passes`` passes."""
        if passes < self.min_passes or (passes < self.max_passes and self.on_way > len(self._held)):
            asyncio.get_running_loop().call_soon(self._check, passes + 1)
            return
        held, self._held = self._held, []
        for fut in held:
            if not fut.done():
                fut.set_result(None)


class Arrival:
    """One request's passage: ``await ready()`` just before it sends; leaving the ``with`` block
    (sent, failed, or the client gone) takes it off the count."""

    def __init__(self, gate: BurstGate) -> None:
        self.gate = gate
        self.on_way = False

    def __enter__(self) -> "Arrival":
        self.on_way = True
        self.gate.on_way += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.leave()

    def leave(self) -> None:
        if self.on_way:
            self.on_way = False
            self.gate.on_way -= 1

    async def ready(self) -> None:
        """Return when this request may be sent, with the rest of its burst (a request sent before,
        a retry, goes at once)."""
        if not self.on_way:
            return
        try:
            await self.gate._hold()
        finally:
            self.leave()

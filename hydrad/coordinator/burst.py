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
GATHER_PASSES = 6  # passes at most in which newly counted requests still join the burst (while each brings one)
MAX_PASSES = 10  # passes of the event loop a ready request waits for the rest of its burst at most


class BurstGate:
    """Tracks requests between their arrival and their send; releases the ready ones together.

    A burst is the requests on their way when the first of them is ready, and those counted in the
    passes after it while it gathers: at least ``min_passes``, and on while each pass brings another,
    up to ``gather_passes``. Those are waited for (up to ``max_passes``), nothing that arrives later,
    so a steady flood of new requests cannot keep a ready burst waiting to the bound."""

    def __init__(self, min_passes: int = MIN_PASSES, max_passes: int = MAX_PASSES,
                 gather_passes: int = GATHER_PASSES) -> None:
        self.min_passes = min_passes
        self.max_passes = max_passes
        self.gather_passes = gather_passes
        self._entered = 0  # arrivals so far: each has its number
        self._unready: set[int] = set()  # numbers of the arrivals on their way and not yet held
        self._held: list[asyncio.Future[None]] = []
        self._cutoff = 0  # the last arrival of the burst being held (fixed after min_passes)

    @property
    def on_way(self) -> int:
        """Requests arrived and neither sent nor given up (held ones included)."""
        return len(self._unready) + sum(1 for f in self._held if not f.done())

    def arrival(self) -> "Arrival":
        """A request's place in the gate, from its arrival until it is sent or fails (a context manager)."""
        return Arrival(self)

    def _enter(self) -> int:
        self._entered += 1
        self._unready.add(self._entered)
        return self._entered

    def _hold(self, number: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._unready.discard(number)
        self._held.append(fut)
        if len(self._held) == 1:
            self._cutoff = self._entered
            loop.call_soon(self._check, 1)
        return fut

    def _check(self, passes: int) -> None:
        """Release the held requests once no request of their burst is still on its way (after
        ``min_passes``), or after ``max_passes`` passes."""
        if passes < self.min_passes or (passes < self.gather_passes and self._entered > self._cutoff):
            self._cutoff = self._entered  # still gathering: what arrives now is part of the burst
        elif passes >= self.max_passes or not any(n <= self._cutoff for n in self._unready):
            held, self._held = self._held, []
            for fut in held:
                if not fut.done():
                    fut.set_result(None)
            return
        asyncio.get_running_loop().call_soon(self._check, passes + 1)


class Arrival:
    """One request's passage: ``await ready()`` just before it sends; leaving the ``with`` block
    (sent, failed, or the client gone) takes it off the count."""

    def __init__(self, gate: BurstGate) -> None:
        self.gate = gate
        self.number = 0  # 0: not on its way (not entered, or sent)

    def __enter__(self) -> "Arrival":
        self.number = self.gate._enter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.leave()

    def leave(self) -> None:
        if self.number:
            self.gate._unready.discard(self.number)
            self.number = 0

    async def ready(self) -> None:
        """Return when this request may be sent, with the rest of its burst (a request sent before,
        a retry, goes at once)."""
        if not self.number:
            return
        try:
            await self.gate._hold(self.number)
        finally:
            self.leave()

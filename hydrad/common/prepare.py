"""A request's own preparation (parsing, schema and tools → grammar), off the event loop that
keeps the daemon alive, with a fair share per client.

Each daemon's event loop also carries the heartbeats, the bus, the watchdog and every other
request's stream. A request's own work on it holds all of that: parsing 40,000 chat messages held
an engine's loop for 0.4 s, and a JSON schema's grammar can take longer. So the doors hand any
request that is not obviously small to :class:`Preparer`, which runs the work on a few worker
threads of its own:

- **small requests stay inline**: a body under :data:`INLINE_BYTES` with none of the fields that
  make grammars (:data:`HEAVY_FIELDS`) costs a fraction of a millisecond to parse, less than a
  hand-over to a thread would;
- **bounded and fair**: at most ``workers`` run at once; the clients waiting (by address)
  take turns, one job each, so one client's heavy requests cannot take the workers from
  everyone else; a client may have ``per_client`` waiting or running, and gets 429 with
  ``Retry-After`` beyond that;
- the work itself still holds the interpreter lock while it runs Python, but the loop thread is
  handed the lock again every switch interval (milliseconds), where inline it waited for the
  whole job. What native code does (llama.cpp's tokenizer) releases the lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")

INLINE_BYTES = 16 << 10
"""Bodies shorter than this, without a grammar-making field, are parsed on the loop itself."""

HEAVY_FIELDS = (b'"tools"', b'"functions"', b'"grammar"', b'"json_schema"', b'"response_format"', b'"schema"')
"""Fields whose work grows with more than the body's length (grammars made from schemas)."""


def light(body: bytes) -> bool:
    """Whether a request body is cheap enough to prepare on the loop."""
    return len(body) < INLINE_BYTES and not any(f in body for f in HEAVY_FIELDS)


def client_key(request: Any) -> str:
    """Who a request is from, for the fair shares: its peer address. Not a header: with no API key
    (or one key shared by all) a client could name itself anew on every request and so take every
    share; keys of their own per tenant will name tenants here."""
    peer = request.client.host if getattr(request, "client", None) else None
    return "addr:" + (peer or "?")


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: "asyncio.Future[Any]"
    loop: asyncio.AbstractEventLoop


class Preparer:
    """Runs preparation jobs on ``workers`` threads of its own, taking the clients that wait in
    turn (one job each, round robin), so a client with many heavy requests queued delays another
    client's by at most one job per worker. A client may have ``per_client`` jobs waiting or
    running; one more raises ``refuse(message)`` (each daemon's 429). A job whose requester has
    gone (its await cancelled) before a worker took it is dropped unrun."""

    def __init__(self, refuse: Callable[[str], Exception], workers: int = 2, per_client: int = 32,
                 name: str = "hydra-prep") -> None:
        self.refuse = refuse
        self.per_client = per_client
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._pending: dict[str, int] = {}
        self._cv = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        self._started = False  # the workers start with the first job: a daemon that never gets one has none

    def pending(self, client: str) -> int:
        with self._cv:
            return self._pending.get(client, 0)

    async def parse(self, request: Any, raw: bytes, parse: Callable[[bytes], T]) -> T:
        """``parse(raw)`` for a request's body (``request``: a Starlette request, for who sent it)."""
        return await self.run(client_key(request), raw, parse, raw)

    async def run(self, client: str, body: bytes, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: inline when ``body`` is light, else on a worker (``refuse`` beyond the share)."""
        if light(body):
            return fn(*args)
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop.create_future(), loop)
        with self._cv:
            held = self._pending.get(client, 0)
            if held >= self.per_client:
                raise self.refuse(f"this client already has {held} requests being prepared (at most "
                                  f"{self.per_client}); retry when one is answered")
            self._pending[client] = held + 1
            self._queues.setdefault(client, deque()).append(job)
            self._cv.notify()
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()
        try:
            return await job.future  # type: ignore[no-any-return]
        finally:
            with self._cv:
                left = self._pending[client] - 1
                if left:
                    self._pending[client] = left
                else:
                    del self._pending[client]

    def _next(self) -> _Job | None:
        with self._cv:
            while not self._queues and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            client, queue = next(iter(self._queues.items()))
            job = queue.popleft()
            del self._queues[client]
            if queue:
                self._queues[client] = queue  # to the back of the turn
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            if job.future.cancelled():
                continue
            try:
                result = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - the request's own error, raised where it awaits
                job.loop.call_soon_threadsafe(_settle, job.future, None, exc)
            else:
                job.loop.call_soon_threadsafe(_settle, job.future, result, None)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def _settle(future: "asyncio.Future[Any]", result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)

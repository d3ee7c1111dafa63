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
- **bounded**: at most ``workers`` run at once, and one client (an API key, else an address) may
  have at most ``per_client`` waiting or running; beyond that it gets 429 with ``Retry-After``,
  so one client's heavy requests cannot take the workers from everyone else;
- the work itself still holds the interpreter lock while it runs Python, but the loop thread is
  handed the lock again every switch interval (milliseconds), where inline it waited for the
  whole job. What native code does (llama.cpp's tokenizer) releases the lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

INLINE_BYTES = 16 << 10
"""Bodies shorter than this, without a grammar-making field, are parsed on the loop itself."""

HEAVY_FIELDS = (b'"tools"', b'"functions"', b'"grammar"', b'"json_schema"', b'"response_format"', b'"schema"')
"""Fields whose work grows with more than the body's length (grammars made from schemas)."""


def light(body: bytes) -> bool:
    """Whether a request body is cheap enough to prepare on the loop."""
    return len(body) < INLINE_BYTES and not any(f in body for f in HEAVY_FIELDS)


def client_key(headers: Any, peer: str | None) -> str:
    """Who a request is from, for the fair share: its API key (hashed, never kept), else its address."""
    auth = headers.get("authorization") or headers.get("x-api-key")
    if auth:
        return "key:" + hashlib.sha256(auth.encode("latin-1", "replace")).hexdigest()[:16]
    return "addr:" + (peer or "?")


class Preparer:
    """Runs preparation jobs on ``workers`` threads, ``per_client`` at most per client; a job beyond
    the share raises ``refuse(message)`` (each daemon's 429)."""

    def __init__(self, refuse: Callable[[str], Exception], workers: int = 2, per_client: int = 4,
                 name: str = "hydra-prep") -> None:
        self.refuse = refuse
        self.per_client = per_client
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def pending(self, client: str) -> int:
        with self._lock:
            return self._pending.get(client, 0)

    async def parse(self, request: Any, raw: bytes, parse: Callable[[bytes], T]) -> T:
        """``parse(raw)`` for a request's body (``request``: a Starlette request, for who sent it)."""
        peer = request.client.host if request.client else None
        return await self.run(client_key(request.headers, peer), raw, parse, raw)

    async def run(self, client: str, body: bytes, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: inline when ``body`` is light, else on a worker (``refuse`` beyond the share)."""
        if light(body):
            return fn(*args)
        with self._lock:
            held = self._pending.get(client, 0)
            if held >= self.per_client:
                raise self.refuse(f"this client already has {held} requests being prepared (at most "
                                  f"{self.per_client}); retry when one is answered")
            self._pending[client] = held + 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args))
        finally:
            with self._lock:
                left = self._pending[client] - 1
                if left:
                    self._pending[client] = left
                else:
                    del self._pending[client]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

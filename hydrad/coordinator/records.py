"""What the coordinator's bus knows of engines and requests: an engine's record (REGISTER, the
latest heartbeat, liveness), the stream of one GENERATE's events, and the failures the front
door tells apart (unreachable engine, a request that cannot be sent, an engine lost mid-request).

Owned by ``bus.CoordinatorBus`` (its reader task is the only writer); read by the front door,
the switcher and the admin API.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hydrad.wire import messages as M

STREAM_LIMIT = 4096  # TOKENS messages buffered for one request before it counts as abandoned
IDENT_SEP = "~"  # DEALER identity = <engine name>~<per-connection nonce>; "~" is never in a name
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_NONCE = re.compile(r"^[A-Za-z0-9]{1,64}$")


def engine_of(ident: bytes) -> str | None:
    """The engine name a DEALER identity claims (``name~nonce``, or a bare name), or None if invalid."""
    try:
        text = ident.decode("ascii")
    except UnicodeDecodeError:
        return None
    name, sep, nonce = text.partition(IDENT_SEP)
    if not _NAME.match(name) or (sep and not _NONCE.match(nonce)):
        return None
    return name


class EngineUnreachable(Exception):
    """The engine is not connected (or not admitted) right now."""


class RequestUnsendable(Exception):
    """A request that cannot be put on the bus (it does not encode, or it is larger than an engine
    accepts): the request's fault, the same on every engine, so never retried. ``too_large`` → 413."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.too_large = too_large


@dataclass(frozen=True)
class EngineLost:
    """A request's engine died, left or re-registered before the request ended."""

    reason: str


StreamEvent = M.Tokens | M.Done | M.Error | EngineLost


class RequestStream:
    """The events of one GENERATE, pushed by the reader task, pulled by one front-door handler."""

    def __init__(self, req: str, engine: str) -> None:
        self.req = req
        self.engine = engine
        self.t0 = time.monotonic()
        self._items: deque[StreamEvent] = deque()
        self._wake = asyncio.Event()
        self.finished = False

    def push(self, ev: StreamEvent) -> bool:
        if self.finished:
            return True
        if len(self._items) >= STREAM_LIMIT and not isinstance(ev, (M.Done, M.Error, EngineLost)):
            return False
        self._items.append(ev)
        if isinstance(ev, (M.Done, M.Error, EngineLost)):
            self.finished = True
        self._wake.set()
        return True

    async def next(self, timeout: float) -> StreamEvent | None:
        """The next event, or None after ``timeout`` seconds without one."""
        if not self._items:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self._items.popleft()


@dataclass
class EngineRecord:
    name: str
    info: M.Register
    status: M.EngineStatus
    ident: bytes = b""  # the DEALER identity of the admitted connection: the only one we send to
    alive: bool = True
    last_seen: float = field(default_factory=time.monotonic)
    up_since: float = field(default_factory=time.time)
    down_reason: str | None = None
    next_ping: float = 0.0
    status_at: float = field(default_factory=time.monotonic)  # when ``status`` arrived
    ended_since_status: int = 0  # bus requests running at that heartbeat that have ended since

    def heard_load(self) -> int:
        """Requests running or queued on the engine by its last heartbeat, less those the bus has
        seen end since: a heartbeat is up to an interval old, and a request that just finished
        must not make its engine look busy to the next turn of the same session."""
        return max(0, self.status.slots_busy + self.status.queued - self.ended_since_status)

    @property
    def interval(self) -> float:
        return self.info.heartbeat_interval_s

    def public(self) -> dict[str, Any]:
        info = self.info
        return {"name": self.name, "alive": self.alive, "down_reason": self.down_reason,
                "last_seen_s": round(time.monotonic() - self.last_seen, 3), "up_since": self.up_since,
                "instance": info.instance, "version": info.version, "pid": info.pid, "http": info.http,
                "rpc": info.rpc, "gpu": info.gpu.model_dump(), "device": info.device,
                "models_on_disk": info.models_on_disk,
                "heartbeat_interval_s": info.heartbeat_interval_s, **self.status.model_dump()}

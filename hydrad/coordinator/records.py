"""What the coordinator's bus knows of engines and requests: an engine's record (REGISTER, the
latest heartbeat, liveness), the COMBINE pairs those records describe (:func:`pairs`), the stream
of one GENERATE's events, and the failures the front door tells apart (unreachable engine, a
request that cannot be sent, an engine lost mid-request).

Owned by ``bus.CoordinatorBus`` (its reader task is the only writer); read by the front door,
the switcher and the admin API.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

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


StreamEvent = M.Tokens | M.Progress | M.Done | M.Error | EngineLost


class RequestStream:
    """The events of one GENERATE, pushed by the reader task, pulled by one front-door handler.

    Waiting is a bare future and a timer rather than ``asyncio.wait_for``: this runs once per
    streamed token, and wait_for's task and event cost more than the rest of the token's relay."""

    def __init__(self, req: str, engine: str, logprobs: int | None = None) -> None:
        self.req = req
        self.engine = engine
        self.logprobs = logprobs  # what its GENERATE asked: the reply renders log-probabilities when not None
        self.on_stream = False  # its GENERATE went on the engine's request stream: so does its CANCEL
        self.t0 = time.monotonic()
        self._items: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.finished = False

    def push(self, ev: StreamEvent) -> bool:
        if self.finished:
            return True
        if len(self._items) >= STREAM_LIMIT and not isinstance(ev, (M.Done, M.Error, EngineLost)):
            return False
        self._items.append(ev)
        if isinstance(ev, (M.Done, M.Error, EngineLost)):
            self.finished = True
        _wake(self._waiter)
        return True

    def ready(self) -> bool:
        """Whether :meth:`next` would return at once."""
        return bool(self._items)

    async def next(self, timeout: float) -> StreamEvent | None:
        """The next event, or None after ``timeout`` seconds without one."""
        if not self._items:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._items:
                return None
        return self._items.popleft()


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


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
                "models_on_disk": info.models_on_disk, "models_fetchable": info.models_fetchable,
                "host_weights": info.host_weights,
                "heartbeat_interval_s": info.heartbeat_interval_s, **self.status.model_dump()}


# ----- COMBINE pairs ---------------------------------------------------------------------

_LOOPBACK = frozenset({"localhost", "ip6-localhost", "::1", "127.0.0.1"})
_WILDCARD = frozenset({"", "0.0.0.0", "::", "*"})


def _endpoint(addr: str) -> tuple[str, str]:
    """``host:port`` as (host, port) for comparing: lower case, no IPv6 brackets, every loopback
    name as 127.0.0.1."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep:
        return addr.strip().lower(), ""
    host = host.strip("[]").lower()
    return ("127.0.0.1" if host in _LOOPBACK else host), port


@dataclass(frozen=True)
class Pair:
    """Whom an engine is paired with in COMBINE, each by engine name where the coordinator knows
    the address (an engine's merged RPC port from its REGISTER), else as the address itself."""

    peers: tuple[str, ...] = ()  # a head's peers: its reported ``peers`` endpoints, named
    heads: tuple[str, ...] = ()  # a peer's heads: the live engines whose ``peers`` name this one's RPC port

    @property
    def names(self) -> list[str]:
        """Everything on the other end: the peers, then the heads (each once)."""
        return list(dict.fromkeys(self.peers + self.heads))

    def public(self) -> dict[str, Any]:
        return {"pair": self.names, "pair_peers": list(self.peers), "pair_heads": list(self.heads)}


def pairs(engines: Mapping[str, EngineRecord]) -> dict[str, Pair]:
    """Every engine's :class:`Pair`, from what the engines report of themselves.

    A head reports its peers as the endpoints it was given (``rpc_servers``); a peer reports the
    client addresses of the heads holding buffers on it (``serving``), which name no engine. So a
    head's endpoint is matched to the engine that registered that RPC address (a live one before
    a dead one; a registered wildcard host such as 0.0.0.0 matches any host on its port when that
    port is registered once), and a peer's heads are the live engines whose peers resolve to it;
    a peer no registered head claims shows its ``serving`` addresses instead. An endpoint no
    engine registered stays ``host:port``.
    """
    exact: dict[tuple[str, str], str] = {}
    wildcard: dict[str, dict[str, bool]] = {}  # port → engine → alive
    # dead records first, so a live engine's claim to an address wins over a dead one's
    for rec in sorted(engines.values(), key=lambda r: (r.alive, r.name)):
        if not rec.info.rpc:
            continue
        host, port = _endpoint(rec.info.rpc)
        if host in _WILDCARD:
            wildcard.setdefault(port, {})[rec.name] = rec.alive
        else:
            exact[(host, port)] = rec.name

    def name_of(endpoint: str) -> str:
        host, port = _endpoint(endpoint)
        found = exact.get((host, port))
        if found is None and port in wildcard:
            alive = [n for n, up in wildcard[port].items() if up]
            some = alive if alive else list(wildcard[port])
            found = some[0] if len(some) == 1 else None
        return found or endpoint

    peers = {name: tuple(dict.fromkeys(name_of(ep) for ep in rec.status.peers)) for name, rec in engines.items()}
    heads: dict[str, list[str]] = {}
    for name in sorted(engines):
        if engines[name].alive:
            for peer in peers[name]:
                if peer != name and peer in engines:
                    heads.setdefault(peer, []).append(name)
    out: dict[str, Pair] = {}
    for name, rec in engines.items():
        mine = tuple(heads.get(name, ()))
        if not mine and rec.status.serving:
            mine = tuple(dict.fromkeys(rec.status.serving))
        out[name] = Pair(peers=peers[name], heads=mine)
    return out

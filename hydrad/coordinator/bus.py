"""The coordinator's side of the bus: a ROUTER for the engines, a PUB for events, the engine registry.

Ownership follows the zguide (and vLLM's engine core): one reader task owns ``recv`` on the
ROUTER and is the only writer of the registry; one liveness task ages records and PINGs
engines. Sends are non-blocking calls from the same event-loop thread, so no socket ever
crosses threads and no caller ever waits on a socket.

- ``ROUTER_MANDATORY``: sending to an engine that is not connected raises instead of vanishing,
  which we use to learn of a dead engine within one PING instead of three heartbeats.
- ``ROUTER_HANDOVER``: a restarted engine reconnecting under its name takes the name over
  from the dead connection.
- Liveness: any message from an engine counts as life; silent for ``liveness`` of its declared
  heartbeat intervals ⇒ dead, its requests fail at once (so the front door can retry
  elsewhere) and it is re-admitted only by a new REGISTER.
- Malformed frames, unknown kinds, and messages from names that never registered are logged
  (rate-limited) and dropped; nothing a peer sends can end the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq
import zmq.asyncio

from hydrad.bus import messages as M
from hydrad.logs import log_event

log = logging.getLogger("hydra.coordinator.bus")

HWM = 10_000
STREAM_LIMIT = 4096  # TOKENS messages buffered for one request before it counts as abandoned


class EngineUnreachable(Exception):
    """The engine is not connected (or not admitted) right now."""


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
                "rpc": info.rpc, "gpu": info.gpu.model_dump(), "models_on_disk": info.models_on_disk,
                "heartbeat_interval_s": info.heartbeat_interval_s, **self.status.model_dump()}


@dataclass
class _Configure:
    engine: str
    reply: asyncio.Future[M.ConfigureReply]
    loaded: asyncio.Future[M.LoadDone]


Listener = Callable[[str, EngineRecord], None]  # kind: "up" | "down" | "status"


class CoordinatorBus:
    def __init__(self, settings: Any, *, version: str) -> None:
        self.settings = settings
        self.version = version
        self.engines: dict[str, EngineRecord] = {}
        self.listeners: list[Listener] = []
        self._streams: dict[str, RequestStream] = {}
        self._configures: dict[str, _Configure] = {}
        self._ctx = zmq.asyncio.Context()
        self._router: zmq.asyncio.Socket | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._warned: dict[str, float] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self.bus_endpoint = ""
        self.events_endpoint = ""

    # ----- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind both sockets (raises zmq.ZMQError naming a taken port) and start the two tasks."""
        s = self.settings
        router = self._ctx.socket(zmq.ROUTER)
        pub = self._ctx.socket(zmq.PUB)
        try:
            for sock in (router, pub):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, HWM)
                sock.setsockopt(zmq.RCVHWM, HWM)
                if s.bus.curve_secret_key:
                    sock.setsockopt(zmq.CURVE_SERVER, 1)
                    sock.setsockopt(zmq.CURVE_SECRETKEY, s.bus.curve_secret_key.encode())
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            router.setsockopt(zmq.MAXMSGSIZE, M.MAX_BODY + 4096)
            router.bind(s.bus.endpoint)
            pub.bind(s.events)
        except zmq.ZMQError:
            router.close(linger=0)
            pub.close(linger=0)
            raise
        self._router, self._pub = router, pub
        self.bus_endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.events_endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._tasks = [asyncio.create_task(self._read(), name="bus-reader"),
                       asyncio.create_task(self._liveness(), name="bus-liveness")]

    @property
    def healthy(self) -> bool:
        """Both tasks running (the daemon withholds WATCHDOG=1 otherwise)."""
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for stream in list(self._streams.values()):
            stream.push(EngineLost("coordinator stopping"))
        self._streams.clear()
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()

    # ----- sending ---------------------------------------------------------------------

    def send(self, engine: str, msg: Any) -> None:
        """Non-blocking send to an engine; ``EngineUnreachable`` when it is not connected or its queue is full."""
        assert self._router is not None
        try:
            self._router.send_multipart([engine.encode(), *M.encode(msg)], flags=zmq.NOBLOCK).result()
        except zmq.Again:
            raise EngineUnreachable(f"engine {engine}: bus queue full") from None
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise EngineUnreachable(f"engine {engine} is not connected") from None
            raise EngineUnreachable(f"engine {engine}: {exc}") from None

    def publish(self, topic: str, **data: Any) -> None:
        """An event for consoles; PUB drops it at the high-water mark rather than block."""
        if self._pub is None:
            return
        with contextlib.suppress(Exception):
            self._pub.send_multipart(M.Event(topic=topic, ts=time.time(), data=data).frames(), flags=zmq.NOBLOCK)

    def new_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}-{next(self._ids)}"

    def generate(self, engine: str, msg: M.Generate) -> RequestStream:
        rec = self.engines.get(engine)
        if rec is None or not rec.alive:
            raise EngineUnreachable(f"engine {engine} is not alive")
        stream = RequestStream(msg.req, engine)
        self._streams[msg.req] = stream
        try:
            self.send(engine, msg)
        except EngineUnreachable:
            self._streams.pop(msg.req, None)
            raise
        return stream

    def cancel(self, stream: RequestStream) -> None:
        """The client went away (or gave up): tell the engine, forget the stream."""
        if self._streams.pop(stream.req, None) is not None and not stream.finished:
            with contextlib.suppress(EngineUnreachable):
                self.send(stream.engine, M.Cancel(req=stream.req))
            self._ended(stream)

    def _ended(self, stream: RequestStream) -> None:
        rec = self.engines.get(stream.engine)
        if rec is not None and stream.t0 < rec.status_at:
            rec.ended_since_status += 1

    def inflight(self, engine: str) -> int:
        return sum(1 for s in self._streams.values() if s.engine == engine)

    def inflight_total(self) -> int:
        return len(self._streams)

    async def configure(self, engine: str, payload: dict[str, Any], *, reply_timeout: float,
                        load_timeout: float) -> tuple[M.ConfigureReply, M.LoadDone | None]:
        """CONFIGURE an engine and wait for its answer, then (for a model load) for LOADED.

        Raises ``EngineUnreachable`` if the engine is gone or goes away meanwhile and
        ``TimeoutError`` if it does not answer in time.
        """
        rec = self.engines.get(engine)
        if rec is None or not rec.alive:
            raise EngineUnreachable(f"engine {engine} is not alive")
        req = self.new_id("cfg")
        loop = asyncio.get_running_loop()
        pending = _Configure(engine, loop.create_future(), loop.create_future())
        self._configures[req] = pending
        try:
            self.send(engine, M.Configure(req=req, payload=payload))
            reply = await asyncio.wait_for(asyncio.shield(pending.reply), reply_timeout)
            if not reply.ok or reply.result.get("load_id") is None:
                return reply, None
            loaded = await asyncio.wait_for(asyncio.shield(pending.loaded), load_timeout)
            return reply, loaded
        finally:
            self._configures.pop(req, None)
            for fut in (pending.reply, pending.loaded):
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # retrieved, so asyncio does not report it as lost

    # ----- receiving -------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._router is not None
        while True:
            try:
                frames = await self._router.recv_multipart()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                self._warn("recv", "bus receive failed", error=str(exc))
                await asyncio.sleep(0.01)
                continue
            try:
                self._on_frames(frames)
            except Exception as exc:  # a handler bug must not end the one reader
                log_event(log, logging.ERROR, "bus message handler failed", error=repr(exc), exc_info=True)

    def _on_frames(self, frames: list[bytes]) -> None:
        ident = frames[0]
        try:
            name = ident.decode("ascii")
        except UnicodeDecodeError:
            name = ""
        if not name or len(name) > 64 or not all(c.isalnum() or c in "_.-" for c in name):
            self._warn(f"ident:{ident[:16]!r}", "bus message from a peer with an invalid identity dropped",
                       identity=repr(ident[:32]))
            return
        try:
            msg = M.decode(frames[1:])
        except M.BusDecodeError as exc:
            self._warn(f"malformed:{name}", "malformed bus message dropped", engine=name, error=exc.reason)
            return
        if type(msg) not in M.FROM_ENGINE:
            self._warn(f"direction:{name}", "bus message of the wrong direction dropped", engine=name,
                       kind=msg.KIND.decode())
            return
        if isinstance(msg, M.Register):
            self._register(name, msg)
            return
        rec = self.engines.get(name)
        if rec is None or not rec.alive:
            self._warn(f"unknown:{name}", "bus message from an unregistered engine dropped; asking it to register",
                       engine=name, kind=msg.KIND.decode())
            with contextlib.suppress(EngineUnreachable):
                self.send(name, M.Reregister(reason="unknown engine" if rec is None else f"marked dead: {rec.down_reason}"))
            return
        rec.last_seen = time.monotonic()
        if isinstance(msg, M.Heartbeat):
            self._status(rec, msg.status)
        elif isinstance(msg, (M.Tokens, M.Done, M.Error)):
            stream = self._streams.get(msg.req)
            if stream is None or stream.engine != name:
                return  # a request cancelled or failed over a moment ago: its tail is expected
            if not stream.push(msg):
                self._warn(f"slow:{name}", "request stream overflowed; cancelling it", engine=name, req=msg.req)
                self._streams.pop(msg.req, None)
                stream.finished = False
                stream.push(EngineLost("the client is not reading the stream"))
                with contextlib.suppress(EngineUnreachable):
                    self.send(name, M.Cancel(req=msg.req))
            elif stream.finished:
                self._streams.pop(msg.req, None)
                self._ended(stream)
        elif isinstance(msg, M.ConfigureReply):
            pending = self._configures.get(msg.req)
            if pending is not None and pending.engine == name and not pending.reply.done():
                pending.reply.set_result(msg)
        elif isinstance(msg, M.LoadDone):
            pending = self._configures.get(msg.req)
            if pending is not None and pending.engine == name and not pending.loaded.done():
                pending.loaded.set_result(msg)
        elif isinstance(msg, M.Goodbye):
            self._down(rec, f"left: {msg.reason}" if msg.reason else "left")

    def _register(self, name: str, msg: M.Register) -> None:
        if msg.engine != name:
            self._warn(f"mismatch:{name}", "REGISTER naming another engine than its identity dropped",
                       identity=name, engine=msg.engine)
            return
        rec = self.engines.get(name)
        repeat = rec is not None and rec.alive and rec.info.instance == msg.instance
        if rec is not None and rec.alive and not repeat:
            self._fail_engine(name, f"engine {name} re-registered (restarted or reconnected)")
        if rec is None:
            rec = self.engines[name] = EngineRecord(name, msg, msg.status)
        old_stage = rec.status.stage
        rec.info, rec.alive, rec.down_reason = msg, True, None
        rec.last_seen = time.monotonic()
        try:
            self.send(name, M.Welcome(coordinator=self.settings.name, version=self.version))
        except EngineUnreachable:
            pass
        if repeat:
            self._status(rec, msg.status)
            return
        rec.up_since = time.time()
        rec.status = msg.status
        rec.status_at, rec.ended_since_status = time.monotonic(), 0
        rec.next_ping = time.monotonic() + rec.interval
        log_event(log, logging.INFO, "engine up", engine=name, http=msg.http, rpc=msg.rpc, gpu=msg.gpu.description or msg.gpu.name,
                  arch=msg.gpu.arch, stage=msg.status.stage, model=msg.status.model or "-",
                  models_on_disk=",".join(msg.models_on_disk), version=msg.version)
        self.publish("engine.up", engine=name, http=msg.http, rpc=msg.rpc, gpu=msg.gpu.model_dump(),
                     stage=msg.status.stage, model=msg.status.model, previous_stage=old_stage)
        self._notify("up", rec)

    def _status(self, rec: EngineRecord, status: M.EngineStatus) -> None:
        old = rec.status
        rec.status = status
        rec.status_at, rec.ended_since_status = time.monotonic(), 0
        if status.stage != old.stage or status.model != old.model:
            log_event(log, logging.INFO, "engine stage", engine=rec.name, stage=status.stage, model=status.model or "-")
            self.publish("engine.stage", engine=rec.name, stage=status.stage, previous=old.stage, model=status.model,
                         loading_model=status.loading_model)
        if status.progress is not None and status.progress != old.progress:
            self.publish("engine.progress", engine=rec.name, stage=status.stage, progress=status.progress,
                         loading_model=status.loading_model, load_id=status.load_id)
        self._notify("status", rec)

    # ----- liveness --------------------------------------------------------------------

    async def _liveness(self) -> None:
        liveness = self.settings.liveness
        tick = max(0.02, min(0.25, self.settings.heartbeat_interval_s / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for rec in list(self.engines.values()):
                if not rec.alive:
                    continue
                silent = now - rec.last_seen
                if silent > liveness * rec.interval:
                    self._down(rec, f"no heartbeat for {silent:.1f} s ({liveness} intervals of {rec.interval:g} s)")
                    continue
                if now >= rec.next_ping:
                    rec.next_ping = now + min(rec.interval, self.settings.heartbeat_interval_s)
                    try:
                        self.send(rec.name, M.Ping())
                    except EngineUnreachable as exc:
                        if "not connected" in str(exc):
                            self._down(rec, "disconnected")

    def _down(self, rec: EngineRecord, reason: str) -> None:
        if not rec.alive:
            return
        rec.alive = False
        rec.down_reason = reason
        log_event(log, logging.WARNING, "engine down", engine=rec.name, reason=reason)
        self.publish("engine.down", engine=rec.name, reason=reason)
        self._fail_engine(rec.name, f"engine {rec.name} is down: {reason}")
        self._notify("down", rec)

    def _fail_engine(self, name: str, reason: str) -> None:
        for req, stream in list(self._streams.items()):
            if stream.engine == name:
                self._streams.pop(req, None)
                stream.push(EngineLost(reason))
        for pending in self._configures.values():
            if pending.engine == name:
                for fut in (pending.reply, pending.loaded):
                    if not fut.done():
                        fut.set_exception(EngineUnreachable(reason))

    def _notify(self, kind: str, rec: EngineRecord) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, rec)
            except Exception as exc:
                log_event(log, logging.ERROR, "engine listener failed", kind=kind, engine=rec.name, error=repr(exc),
                          exc_info=True)

    def _warn(self, key: str, text: str, **fields: Any) -> None:
        """Log a problem a peer can repeat at will at most every 10 s per key (and per engine)."""
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= 10.0:
            self._warned[key] = now
            if len(self._warned) > 10_000:
                self._warned.clear()
            log_event(log, logging.WARNING, text, **fields)

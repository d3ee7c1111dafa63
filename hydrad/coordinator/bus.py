"""The coordinator's side of the bus: a ROUTER for the engines, a PUB for events, the engine registry.

Ownership follows the zguide (and vLLM's engine core): one reader task owns ``recv`` on the
ROUTER and is the only writer of the registry; one liveness task ages records and PINGs
engines. Sends are non-blocking calls from the same event-loop thread, so no socket ever
crosses threads and no caller ever waits on a socket.

- ``ROUTER_MANDATORY``: sending to an engine that is not connected raises instead of vanishing,
  which we use to learn of a dead engine within one PING instead of three heartbeats.
- Identities: an engine's DEALER identity is ``<name>~<random nonce>``, new for every
  connection, and the coordinator sends to the identity of the engine's last *admitted*
  REGISTER. A peer that merely claims an engine's name (even its bare name, with
  ``ROUTER_HANDOVER`` taking a routing id over) therefore never receives that engine's traffic,
  and a reconnecting engine needs no handover to reclaim its name.
- Admission: with a bus token configured (``bus_token_file``) a REGISTER must carry the same
  token; otherwise it is answered REFUSED (with why) and the peer gets nothing else: no request,
  no configure, no PING. A message from a peer that was not admitted is dropped.
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
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import zmq
import zmq.asyncio

from hydrad.common import tokenfile
from hydrad.wire import messages as M
from hydrad.wire.busevents import Event
from hydrad.common.logs import LogThrottle, log_event
from hydrad.coordinator.eventsdoor import EventsDoor
from hydrad.coordinator.reqstream import RequestStreamDoor
from hydrad.coordinator.records import (  # noqa: F401 (re-exported: the bus's public types)
    EngineLost, EngineRecord, EngineUnreachable, RequestStream, RequestUnsendable, engine_of,
)

log = logging.getLogger("hydra.coordinator.bus")

HWM = 10_000
READ_BATCH = 64  # bus messages handled before the reader lets the event loop run other tasks
REGISTER_GAP_S = 0.05


@dataclass
class _Configure:
    engine: str
    reply: asyncio.Future[M.ConfigureReply]
    loaded: asyncio.Future[M.LoadDone]


SUBSCRIPTIONS_READ = 256  # subscription messages read per event at most (the rest at the next one)
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
        self._pub_plain: zmq.Socket | None = None  # the same socket, for reading subscriptions without a future
        self._subscriptions = 0  # topics some console subscribes to (see _listened)
        self._tasks: list[asyncio.Task[None]] = []
        self._throttle = LogThrottle()
        self._asked: dict[bytes, float] = {}  # identity → when it was last answered REREGISTER
        self._registers: dict[bytes, float] = {}  # identity → when its last REGISTER was decoded
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self.bus_endpoint = ""
        self.events_endpoint = ""
        self.token: str | None = None  # the pool's bus token; None = an open bus (loopback only)
        self.events_door = EventsDoor(tokenfile.new_token())  # the daemon sets the pool's; until then nobody subscribes
        self.request_stream: RequestStreamDoor | None = None  # the request path beside the bus, when configured
        self.files_port: int | None = None  # the HTTP port serving model files (FILES after WELCOME), when it does

    def load_token(self) -> None:
        """Read the bus token (``HYDRA_BUS_TOKEN_FILE`` wins over ``bus_token_file``); raises TokenError."""
        path = bus_token_path(self.settings)
        self.token = tokenfile.read_token(path) if path is not None else None
        if path is not None and tokenfile.loose_permissions(path):
            log_event(log, logging.WARNING, "the bus token file is readable by every user; chmod 600 it",
                      path=str(path))

    # ----- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind both sockets (raises zmq.ZMQError naming a taken port) and start the two tasks."""
        s = self.settings
        router = self._ctx.socket(zmq.ROUTER)
        pub = self._ctx.socket(zmq.XPUB)  # a PUB that passes subscriptions up: no console, no event built
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
            # Only an engine's own messages arrive here, and none is near the limit: a peer that
            # sends more is not one of ours, and dropping its connection harms nobody else.
            router.setsockopt(zmq.MAXMSGSIZE, M.MAX_BODY + 4096)
            router.bind(s.bus.endpoint)
            self.events_door.secure(pub, self._ctx, curve=bool(s.bus.curve_secret_key))
            pub.bind(s.events)
        except zmq.ZMQError:
            router.close(linger=0)
            pub.close(linger=0)
            raise
        door = None
        plan = s.bus.stream_plan()
        if plan is not None:
            endpoint, strict = plan
            door = RequestStreamDoor(self, endpoint)
            try:
                door.bind()
            except OSError as exc:
                if strict:
                    router.close(linger=0)
                    pub.close(linger=0)
                    raise zmq.ZMQError(exc.errno or zmq.EADDRINUSE, f"request_stream {endpoint}: {exc}") from None
                log_event(log, logging.WARNING, "request stream not started; requests go over the bus",
                          endpoint=endpoint, error=str(exc), hint="set bus.request_stream to a free host:port, or off")
                door = None
        self._router, self._pub = router, pub
        self.request_stream = door
        self._pub_plain = zmq.Socket.shadow(pub.underlying)
        self.bus_endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.events_endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._tasks = [asyncio.create_task(self._read(), name="bus-reader"),
                       asyncio.create_task(self._liveness(), name="bus-liveness")]
        if door is not None:
            self._tasks.append(asyncio.create_task(door.serve(), name="bus-request-stream"))

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
        if self.request_stream is not None:
            self.request_stream.close()
        for stream in list(self._streams.values()):
            stream.push(EngineLost("coordinator stopping"))
        self._streams.clear()
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()

    # ----- sending ---------------------------------------------------------------------

    def offer_files(self, port: int) -> None:
        """Model files are served on ``port`` from now on: engines registering later get FILES after WELCOME,
        and those already registered (they may have come while the HTTP door was starting) get it now."""
        self.files_port = port
        for name, rec in list(self.engines.items()):
            if rec.alive:
                with contextlib.suppress(EngineUnreachable, M.BusEncodeError):
                    self.send(name, M.FilesOffer(port=port))

    def send(self, engine: str, msg: Any, on_stream: bool = False) -> None:
        """Non-blocking send to an admitted engine; ``EngineUnreachable`` when it is not connected or
        its queue is full; ``M.BusEncodeError`` (nothing sent) when the message cannot be encoded."""
        rec = self.engines.get(engine)
        if rec is None or not rec.ident:
            raise EngineUnreachable(f"engine {engine} is not registered")
        self._send_to(rec.ident, engine, M.encode(msg), on_stream)

    def _reply(self, ident: bytes, msg: Any) -> None:
        """An answer to whoever sent a message (admitted or not): WELCOME, REFUSED, REREGISTER."""
        with contextlib.suppress(EngineUnreachable, M.BusEncodeError):
            self._send_to(ident, ident.decode("ascii", "replace"), M.encode(msg))

    def _send_to(self, ident: bytes, engine: str, frames: list[bytes], on_stream: bool = False) -> None:
        """``on_stream``: on the engine's request stream (EngineUnreachable when it is down), else the bus.
        A request's messages all go the way its GENERATE went: the two paths keep no order between them."""
        assert self._router is not None
        if on_stream:
            if self.request_stream is None or not self.request_stream.send(ident, engine, frames):
                raise EngineUnreachable(f"engine {engine}: its request stream is down")
            return
        try:
            self._router.send_multipart([ident, *frames], flags=zmq.NOBLOCK).result()
        except zmq.Again:
            raise EngineUnreachable(f"engine {engine}: bus queue full") from None
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise EngineUnreachable(f"engine {engine} is not connected") from None
            raise EngineUnreachable(f"engine {engine}: {exc}") from None

    def publish(self, topic: str, **data: Any) -> None:
        """An event for consoles, dropped at the high-water mark rather than block, and not even built
        while no console subscribes (one per request otherwise: a tenth of the coordinator's time)."""
        if self._pub is None or not self._listened():
            return
        with contextlib.suppress(Exception):
            data = self.events_door.scrub(data)  # session ids go out as keyed hashes
            self._pub.send_multipart(Event(topic=topic, ts=time.time(), data=data).frames(), flags=zmq.NOBLOCK)

    def _listened(self) -> bool:
        """Whether a console subscribes now. The XPUB hands up each topic's first subscription and its
        last unsubscription (a subscriber that disconnects unsubscribes); they are read here, when an
        event is about to go, which is as soon as a plain PUB would have applied them."""
        assert self._pub_plain is not None  # set with _pub
        for _ in range(SUBSCRIPTIONS_READ):  # bounded: a peer flooding the socket cannot hold the loop here
            try:
                msg = self._pub_plain.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return self._subscriptions > 0
            if msg[:1] == b"\x01":
                self._subscriptions += 1
            elif msg[:1] == b"\x00":
                self._subscriptions = max(0, self._subscriptions - 1)
        return self._subscriptions > 0

    def new_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}-{next(self._ids)}"

    @staticmethod
    def encode_generate(msg: M.Generate) -> list[bytes]:
        """GENERATE's frames; ``RequestUnsendable`` (the request's own fault, never retried) when
        it cannot be encoded."""
        try:
            return M.encode(msg)
        except M.BusEncodeError as exc:
            raise RequestUnsendable(exc.reason, too_large=exc.too_large) from None

    def generate(self, engine: str, msg: M.Generate, frames: list[bytes] | None = None) -> RequestStream:
        """Send GENERATE (``frames``: encoded before, so a burst's sends follow each other closely)
        and return the stream its events will arrive on.

        The stream is registered only once the message is on its way: a request that fails to
        encode or to send leaves nothing behind (an entry left here would count as a busy slot
        of that engine forever). No event can arrive in between: the reader runs on this loop
        and this method does not yield. ``RequestUnsendable`` for the request's own fault
        (never retried), ``EngineUnreachable`` for the engine's.
        """
        rec = self.engines.get(engine)
        if rec is None or not rec.alive:
            raise EngineUnreachable(f"engine {engine} is not alive")
        on_stream = self.request_stream is not None and self.request_stream.carries(rec.ident)
        self._send_to(rec.ident, engine, frames if frames is not None else self.encode_generate(msg), on_stream)
        stream = RequestStream(msg.req, engine, msg.logprobs)
        stream.on_stream = on_stream
        self._streams[msg.req] = stream
        return stream

    def cancel(self, stream: RequestStream) -> None:
        """The client went away (or gave up): tell the engine, forget the stream."""
        if self._streams.pop(stream.req, None) is not None and not stream.finished:
            with contextlib.suppress(EngineUnreachable, M.BusEncodeError):
                self.send(stream.engine, M.Cancel(req=stream.req), stream.on_stream)
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
            try:
                self.send(engine, M.Configure(req=req, payload=payload))
            except M.BusEncodeError as exc:
                raise EngineUnreachable(f"engine {engine}: {exc.reason}") from None
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
        """The one reader of the ROUTER. After each awaited message it takes what else has already
        arrived through a plain (shadow) socket, up to READ_BATCH: an awaited receive costs a future
        and an event-loop pass, and under many streams most messages are already waiting."""
        assert self._router is not None
        plain = zmq.Socket.shadow(self._router.underlying)
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
            self._handle(frames)
            for _ in range(READ_BATCH - 1):
                try:
                    frames = plain.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:  # EAGAIN: nothing more waiting (or closed: the awaited receive says so)
                    break
                self._handle(frames)
            else:
                # a full batch: more is queued, and a queued message resolves the awaited receive at once,
                # without yielding; under a flood the reader would hold the event loop and the front door
                await asyncio.sleep(0)

    def _handle(self, frames: list[bytes]) -> None:
        try:
            self._on_frames(frames)
        except Exception as exc:  # a handler bug must not end the one reader
            log_event(log, logging.ERROR, "bus message handler failed", error=repr(exc), exc_info=True)

    def _on_frames(self, frames: list[bytes]) -> None:
        ident = frames[0]
        name = engine_of(ident)
        if name is None:
            self._warn(f"ident:{ident[:16]!r}", "bus message from a peer with an invalid identity dropped",
                       identity=repr(ident[:32]))
            return
        rec = self.engines.get(name)
        if (len(frames) < 3 or frames[2] != M.Register.KIND) and (rec is None or not rec.alive or rec.ident != ident):
            # not the admitted connection of a live engine, and not a REGISTER: dropped before its body is
            # decoded (the cost of a flood from a stranger is a dict lookup), answered at most once an
            # interval per identity
            self._unadmitted(name, ident, rec, frames[2] if len(frames) > 2 else b"?")
            return
        if len(frames) > 2 and frames[2] == M.Register.KIND and not self._register_allowed(ident):
            return
        try:
            msgs = M.decode_all(frames[1:])
        except M.BusDecodeError as exc:
            self._warn(f"malformed:{name}", "malformed bus message dropped", engine=name, error=exc.reason)
            return
        for msg in msgs:
            if type(msg) not in M.FROM_ENGINE:
                self._warn(f"direction:{name}", "bus message of the wrong direction dropped", engine=name,
                           kind=msg.KIND.decode())
            elif isinstance(msg, M.Register):  # never in a batch (decode_all): frames[2] was REGISTER
                self._register(name, ident, msg)
            else:
                assert rec is not None
                self._on_message(rec, name, msg)

    def _on_message(self, rec: EngineRecord, name: str, msg: M.Message) -> None:
        """One message of an admitted engine."""
        rec.last_seen = time.monotonic()
        if isinstance(msg, M.Heartbeat):
            self._status(rec, msg.status)
        elif isinstance(msg, (M.Tokens, M.Progress, M.Done, M.Error)):
            stream = self._streams.get(msg.req)
            if stream is None or stream.engine != name:
                return  # a request cancelled or failed over a moment ago: its tail is expected
            if not stream.push(msg):
                self._warn(f"slow:{name}", "request stream overflowed; cancelling it", engine=name, req=msg.req)
                self._streams.pop(msg.req, None)
                stream.finished = False
                stream.push(EngineLost("the client is not reading the stream"))
                with contextlib.suppress(EngineUnreachable, M.BusEncodeError):
                    self.send(name, M.Cancel(req=msg.req), stream.on_stream)
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

    def _register(self, name: str, ident: bytes, msg: M.Register) -> None:
        if msg.engine != name:
            self._warn(f"mismatch:{name}", "REGISTER naming another engine than its identity dropped",
                       identity=name, engine=msg.engine)
            return
        if self.token is not None and not tokenfile.same(msg.token, self.token):
            why = ("this bus needs a token: set the engine's bus.token_file to the pool's token file"
                   if msg.token is None else "wrong bus token: the engine's bus.token_file differs from the pool's")
            self._warn(f"refused:{name}", "REGISTER refused", engine=name, why=why, pid=msg.pid)
            self._reply(ident, M.Refused(reason=why))
            return
        msg = msg.model_copy(update={"token": None})  # the record is shown by /admin/engines; the secret is not
        rec = self.engines.get(name)
        repeat = rec is not None and rec.alive and rec.info.instance == msg.instance and rec.ident == ident
        if rec is not None and rec.alive and not repeat:
            self._fail_engine(name, f"engine {name} re-registered (restarted or reconnected)")
        if rec is None:
            rec = self.engines[name] = EngineRecord(name, msg, msg.status)
        old_stage = rec.status.stage
        rec.info, rec.alive, rec.down_reason, rec.ident = msg, True, None, ident
        rec.last_seen = time.monotonic()
        with contextlib.suppress(EngineUnreachable, M.BusEncodeError):
            self.send(name, M.Welcome(coordinator=self.settings.name, version=self.version))
            if self.request_stream is not None:
                self.send(name, M.StreamOffer(endpoint=self.request_stream.endpoint))
            if self.files_port is not None:
                self.send(name, M.FilesOffer(port=self.files_port))
        if repeat:
            self._status(rec, msg.status)
            return
        rec.up_since = time.time()
        rec.status = msg.status
        rec.status_at, rec.ended_since_status = time.monotonic(), 0
        rec.next_ping = time.monotonic() + rec.interval
        log_event(log, logging.INFO, "engine up", engine=name, http=msg.http, rpc=msg.rpc, device=msg.device or "all",
                  gpu=msg.gpu.description or msg.gpu.name,
                  arch=msg.gpu.arch, stage=msg.status.stage, model=msg.status.model or "-",
                  models_on_disk=",".join(msg.models_on_disk), version=msg.version)
        self.publish("engine.up", engine=name, http=msg.http, rpc=msg.rpc, gpu=msg.gpu.model_dump(), device=msg.device,
                     stage=msg.status.stage, model=msg.status.model, previous_stage=old_stage)
        self._notify("up", rec)

    def _status(self, rec: EngineRecord, status: M.EngineStatus) -> None:
        old = rec.status
        rec.status = status
        rec.status_at, rec.ended_since_status = time.monotonic(), 0
        if status.stage == "failed" and old.stage != "failed":
            # The engine thread died: the requests it holds will never end. Fail them now, so
            # those that have not streamed yet are retried elsewhere (routing skips the stage).
            log_event(log, logging.ERROR, "engine failed", engine=rec.name, error=status.last_error or "-")
            self._fail_engine(rec.name, f"engine {rec.name} failed: {status.last_error or 'its engine thread died'}")
        if status.stage != old.stage or status.model != old.model:
            log_event(log, logging.INFO, "engine stage", engine=rec.name, stage=status.stage, model=status.model or "-")
            self.publish("engine.stage", engine=rec.name, stage=status.stage, previous=old.stage, model=status.model,
                         loading_model=status.loading_model)
        if status.progress is not None and (status.progress != old.progress or status.fetch != old.fetch):
            self.publish("engine.progress", engine=rec.name, stage=status.stage, progress=status.progress,
                         loading_model=status.loading_model, load_id=status.load_id,
                         **({"fetch": status.fetch.text} if status.fetch is not None else {}))
        self._notify("status", rec)

    # ----- liveness --------------------------------------------------------------------

    async def _liveness(self) -> None:
        """Every tick: declare engines silent for ``liveness`` intervals down, and ping the others.

        Silence is counted only while this loop listened: after a pass that held the loop (this tick
        came late), what the engines sent meanwhile still waits unread in the socket, so no engine
        is declared down until the reader has had two ticks to catch up."""
        liveness = self.settings.liveness
        tick = max(0.02, min(0.25, self.settings.heartbeat_interval_s / 4))
        last = time.monotonic()
        listening_since = last
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - last > 2 * tick:
                listening_since = now  # the loop was held: its engines' messages have not been read yet
            last = now
            for rec in list(self.engines.values()):
                if not rec.alive:
                    continue
                silent = now - max(rec.last_seen, listening_since - 2 * tick)
                if silent > liveness * rec.interval:
                    self._down(rec, f"no heartbeat for {silent:.1f} s ({liveness} intervals of {rec.interval:g} s)")
                    continue
                if now >= rec.next_ping:
                    rec.next_ping = now + min(rec.interval, self.settings.heartbeat_interval_s)
                    try:
                        self.send(rec.name, M.Ping())
                    except M.BusEncodeError:
                        pass
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
        self.fail_requests(name, reason)
        for pending in self._configures.values():
            if pending.engine == name:
                for fut in (pending.reply, pending.loaded):
                    if not fut.done():
                        fut.set_exception(EngineUnreachable(reason))

    def fail_requests(self, name: str, reason: str) -> None:
        """End every request in flight on engine ``name`` with EngineLost (retried elsewhere if it has
        not streamed yet)."""
        for req, stream in list(self._streams.items()):
            if stream.engine == name:
                self._streams.pop(req, None)
                stream.push(EngineLost(reason))

    def _notify(self, kind: str, rec: EngineRecord) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, rec)
            except Exception as exc:
                log_event(log, logging.ERROR, "engine listener failed", kind=kind, engine=rec.name, error=repr(exc),
                          exc_info=True)

    def _register_allowed(self, ident: bytes) -> bool:
        """At most one REGISTER per identity each ``REGISTER_GAP_S`` is decoded: an engine repeats it every
        tick until welcomed, a flood far faster, and each one costs a decode and a token check."""
        now = time.monotonic()
        if now - self._registers.get(ident, -1e9) < REGISTER_GAP_S:
            self._warn(f"register-rate:{ident[:16]!r}", "REGISTERs arriving faster than one per 50 ms dropped",
                       identity=repr(ident[:32]))
            return False
        if len(self._registers) > 10_000:
            self._registers.clear()
        self._registers[ident] = now
        return True

    def _unadmitted(self, name: str, ident: bytes, rec: EngineRecord | None, kind: bytes) -> None:
        self._warn(f"unknown:{name}", "bus message from an unregistered engine dropped; asking it to register",
                   engine=name, kind=kind[:16].decode("ascii", "replace"))
        now = time.monotonic()
        if now - self._asked.get(ident, -1e9) < self.settings.heartbeat_interval_s:
            return
        if len(self._asked) > 10_000:
            self._asked.clear()
        self._asked[ident] = now
        why = ("unknown engine" if rec is None else f"marked dead: {rec.down_reason}" if not rec.alive
               else "not the admitted connection of this engine")
        self._reply(ident, M.Reregister(reason=why))

    def _warn(self, key: str, text: str, **fields: Any) -> None:
        """Log a problem a peer can repeat at will at most every 10 s per key (and per engine)."""
        self._throttle(log, logging.WARNING, key, text, **fields)


def bus_token_path(settings: Any) -> Path | None:
    """Where the coordinator's bus token is: ``$HYDRA_BUS_TOKEN_FILE`` (set by ``hydractl up`` for its
    pool) wins over the ``bus_token_file`` setting; None when neither names one."""
    env = os.environ.get(tokenfile.ENV_BUS_TOKEN_FILE, "").strip()
    if env:
        return Path(env)
    return getattr(settings, "bus_token_file", None)

"""The engine's side of the bus: a DEALER named after the engine, connected to the coordinator.

It runs on the engine's pulse loop (:mod:`hydrad.engine.pulse`: its own thread, ``zmq.asyncio``),
not on the main loop that runs requests, so nothing a request does can hold up a heartbeat. What
it receives for the engine crosses to the main loop: a GENERATE becomes a coroutine there (and
reaches the core exactly as an HTTP request does), a CONFIGURE runs the engine's control there;
the answers' messages come back through a locked outbox. Ownership follows the zguide's
reliability rules:

- one reader task owns ``recv`` on the socket; sends are non-blocking calls from the pulse
  loop's thread (the socket never leaves it), so a slow coordinator makes a send fail fast
  instead of stalling a token stream;
- any message from the coordinator counts as life; hearing nothing for 3 intervals means
  the coordinator (or the path to it) is gone: close the socket, wait with a doubling
  backoff, reconnect and REGISTER again — requests it had sent are cancelled, since it has
  given up on them too;
- until the coordinator answers WELCOME the link repeats REGISTER each interval instead of
  heartbeating, so a coordinator started after the engines (or restarted) learns of them;
- heartbeats go out every interval and early when the stage, model or load progress moved,
  so a profile switch sees progress without polling; an engine whose engine thread died
  reports stage ``failed`` in its very next heartbeat (within a tick), so routing stops
  sending it requests at once instead of after the watchdog restarts it;
- the DEALER identity is ``<name>~<nonce>``, new for each connection: the coordinator sends
  only to the identity whose REGISTER it admitted, so another peer claiming the same name
  cannot take this engine's traffic over;
- REGISTER carries the pool's bus token (``bus.token_file``, or ``$HYDRA_BUS_TOKEN_FILE``),
  read again at every connection so a rotated token needs no restart; a coordinator that
  refuses it answers REFUSED, which is logged and retried at the reconnect backoff;
- the socket has no ZeroMQ message size limit: with one, a single oversized message makes
  ZeroMQ drop the whole connection (and every request on it). A body over ``MAX_BODY`` is
  instead refused by ``decode`` like any malformed message, and the link stays up;
- a request's TOKENS, DONE and ERROR are queued, and everything queued in one pass of the loop
  goes out as one batch (``messages.encode_batch``): the engine hands a step's events to the
  loop at once, so at 8 streams that is one send a step instead of eight, and one receive on
  the coordinator's side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Coroutine, TypeVar

import zmq
import zmq.asyncio

from hydrad import __version__
from hydrad.common import tokenfile
from hydrad.wire import messages as M
from hydrad.engine.gpu import bound_device, local_gpu
from hydrad.engine.bus.dealer import open_dealer
from hydrad.engine.bus.stream import EngineStream
from hydrad.engine.control import EngineControl
from hydrad.engine.pulse import LoopTicker, Pulse
from hydrad.engine.bus.status import Speed, engine_status, host_weights, models_fetchable, models_on_disk, step_tokens
from hydrad.engine.refusals import refusal
from hydrad.engine.core import RequestRefused
from hydrad.engine.requests import Done, Failed, Progress
from hydrad.wire.events import END
from hydrad.common.logs import LogThrottle, log_event
from hydrad.engine.settings import EngineSettings

log = logging.getLogger("hydrad.bus")
T = TypeVar("T")
LIVENESS = 3  # intervals of silence before the other side counts as gone
BACKOFF_MAX_S = 10.0
REFRESH_S = 5.0  # how often the device's memory and the models' weights are read again for the heartbeat


class EngineLink:
    def __init__(self, settings: EngineSettings, control: EngineControl, *, http: str | None, rpc: str | None,
                 pulse: Pulse | None = None, ticker: LoopTicker | None = None) -> None:
        """``pulse``: the loop the link runs on (None: the loop that calls :meth:`start`, as in unit tests);
        ``ticker``: the main loop's, so a main loop hung for good is reported as a failed engine."""
        self.settings = settings
        self.endpoint = settings.bus.endpoint
        self.interval = settings.bus.heartbeat_interval_s
        self.control = control
        self.core = control.core
        self.instance = uuid.uuid4().hex[:16]
        self.http = http
        self.rpc = rpc
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._epoch = 0  # connections made; REGISTER carries it so a repeat is told from a new connection
        self._welcomed = False
        self._last_heard = 0.0
        self._pulse = pulse
        self._ticker = ticker
        self._main_loop: asyncio.AbstractEventLoop | None = None  # requests and the engine's control run there
        self._link_loop: asyncio.AbstractEventLoop | None = None  # the socket's (the pulse's) loop
        self._run_task: asyncio.Task[None] | None = None
        # _inflight, _on_stream and _outbox are touched from both loops' threads: always under the lock
        self._lock = threading.RLock()
        self._inflight: dict[str, asyncio.Future[None] | concurrent.futures.Future[None]] = {}
        self._side: set[asyncio.Task[None]] = set()  # configure tasks
        self._main: asyncio.Task[None] | concurrent.futures.Future[None] | None = None
        self._speed = Speed()
        self._gpu = M.GpuInfo()
        self._host: dict[str, int] = {}  # REGISTER's host_weights, refreshed with the GPU's figures
        self._gpu_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None  # the device and weights read under way, if any
        self._throttle = LogThrottle()
        self._closing = False
        self._token: str | None = None
        self._refused: str | None = None  # why the coordinator refused the last REGISTER, until admitted
        self._outbox: list[tuple[str, list[bytes], bool]] = []  # (request id, frames, on the stream) until _flush
        self._on_stream: set[str] = set()  # requests whose GENERATE came on the request stream: they answer on it
        self._identity = b""  # this bus connection's DEALER identity
        self._stream: EngineStream | None = None  # the coordinator's request stream, while it has one

    # ----- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Called on the main loop: that is where requests will run; the link itself runs on the pulse."""
        self._main_loop = asyncio.get_running_loop()
        if self._pulse is not None:
            self._main = self._pulse.spawn(self._run())
        else:
            self._main = asyncio.create_task(self._run(), name="bus-link")

    async def close(self, reason: str = "engine stopping") -> None:
        """Say GOODBYE (so the coordinator stops routing here at once), then drop everything."""
        if self._pulse is not None and self._pulse.loop is not asyncio.get_running_loop():
            await self._pulse.run(self._close(reason))
        else:
            await self._close(reason)

    async def _close(self, reason: str) -> None:
        self._closing = True  # no heartbeat or re-REGISTER after the GOODBYE
        self._flush()
        if self._sock is not None and self._welcomed:
            self._send(M.Goodbye(reason=reason))
            await asyncio.sleep(0.05)  # let the I/O thread put it on the wire before linger 0 drops it
        if self._main is not None:
            self._main.cancel()
        if self._refreshing is not None:
            self._refreshing.cancel()
        if self._run_task is not None:
            self._run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run_task
        self._close_stream()
        self._cancel_all()
        for t in list(self._side):
            t.cancel()
        self._ctx.term()

    async def _run(self) -> None:
        self._link_loop = asyncio.get_running_loop()
        self._run_task = asyncio.current_task()
        self._gpu_at = time.monotonic()
        await self._refresh_gpu()  # before the first REGISTER, which carries the figures
        backoff = self.interval
        silent_tries = 0
        while True:
            sock = self._open()
            heard_at_start = self._last_heard = time.monotonic()
            reader = asyncio.create_task(self._read(sock), name="bus-link-reader")
            try:
                await self._beat(reader)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
                self._close_stream()
                self._cancel_all()
                self._welcomed = False
                self._sock = None
                sock.close(linger=0)
            refused, self._refused = self._refused, None
            if refused is None:
                # silence, not a refusal: a partition or a coordinator restart. Each try costs one
                # connection, so retry every interval; the engine is back within about an interval of
                # the network healing (a doubled wait kept it away for seconds after)
                backoff = self.interval
            if refused is not None:
                log_event(log, logging.ERROR, "the coordinator refuses this engine; retrying", endpoint=self.endpoint,
                          reason=refused, backoff_s=round(backoff, 2))
            else:
                silent_tries = 0 if self._last_heard > heard_at_start else silent_tries + 1
                # once per outage at WARNING (and every 100th try), not every interval it lasts
                level = logging.WARNING if silent_tries % 100 == 0 else logging.DEBUG
                log_event(log, level, "coordinator silent; reconnecting", endpoint=self.endpoint,
                          silent_s=round(time.monotonic() - self._last_heard, 2), backoff_s=round(backoff, 2),
                          tries=silent_tries + 1)
            await asyncio.sleep(backoff)
            if refused is not None:
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def token_path(self) -> Path | None:
        """``$HYDRA_BUS_TOKEN_FILE`` (``hydractl up`` sets it for its pool) wins over ``bus.token_file``."""
        env = os.environ.get(tokenfile.ENV_BUS_TOKEN_FILE, "").strip()
        if env:
            return Path(env)
        return getattr(self.settings.bus, "token_file", None)

    def _read_token(self) -> None:
        """(Re)read the bus token; a bad file is logged and REGISTER goes without a token (and is refused)."""
        path = self.token_path()
        if path is None:
            self._token = None
            return
        try:
            self._token = tokenfile.read_token(path)
        except tokenfile.TokenError as exc:
            self._token = None
            log_event(log, logging.ERROR, "cannot read the bus token", path=str(path), error=str(exc))

    def _open(self) -> zmq.asyncio.Socket:
        b = self.settings.bus
        self._read_token()
        # A fresh identity per connection: the coordinator sends only to the one it admitted.
        self._identity = f"{self.settings.name}~{secrets.token_hex(16)}".encode()
        assert self.endpoint is not None
        sock = open_dealer(self._ctx, self.endpoint, self._identity, self.interval, b)
        self._epoch += 1
        self._sock = sock
        log_event(log, logging.INFO, "bus connecting", endpoint=self.endpoint, engine=self.settings.name,
                  curve=bool(b.curve_server_key), token=self._token is not None)
        return sock

    # ----- sending ---------------------------------------------------------------------

    def _send(self, msg: Any) -> bool:
        """Non-blocking send from the loop thread; False when the coordinator is not reachable now."""
        frames = self._encoded(msg)
        return frames is not None and self._send_frames(frames, msg.KIND.decode())

    def _queue(self, msg: M.Tokens | M.Done | M.Error) -> bool:
        """A request's stream message, sent in one batch with every other one queued in this pass of the
        loop (see the module doc). False when it cannot go: no connection, or a message the bus cannot
        carry (an ERROR is queued in its place)."""
        frames = self._encoded(msg)
        if frames is None:
            return False
        with self._lock:
            self._outbox.append((msg.req, frames, msg.req in self._on_stream))
            first = len(self._outbox) == 1
        if first:  # from the main loop (a request's events) or the link's own (a refusal it answers itself)
            (self._link_loop or asyncio.get_running_loop()).call_soon_threadsafe(self._flush)
        return True

    def _encoded(self, msg: Any) -> list[bytes] | None:
        """``msg``'s frames, or None when there is no connection or the bus cannot carry it (then the
        caller's generation stops, and is cancelled in the core)."""
        if self._sock is None:
            return None
        try:
            return M.encode(msg)
        except M.BusEncodeError as exc:
            self._encode_failed(msg, exc)
            return None

    def _flush(self) -> None:
        """Send the queued stream messages, in batches of at most ``MAX_BODY`` bytes and ``MAX_BATCH``
        messages. The requests of a batch that could not go are cancelled, as a failed send of their own
        would have stopped them."""
        with self._lock:
            queued, self._outbox = self._outbox, []
        for on_stream in (True, False):  # a request answers the way its GENERATE came (no order between the two)
            out = [(req, frames) for req, frames, via in queued if via == on_stream]
            i = 0
            while i < len(out):
                j, size = i + 1, len(out[i][1][2])
                while j < len(out) and j - i < M.MAX_BATCH and size + len(out[j][1][2]) <= M.MAX_BODY:
                    size += len(out[j][1][2])
                    j += 1
                part, i = out[i:j], j
                frames = M.encode_batch([f for _, f in part])
                if on_stream:
                    sent = self._stream is not None and self._stream.send(frames)
                else:
                    sent = self._send_frames(frames, part[0][1][1].decode())
                if not sent:
                    for req, _ in part:
                        with self._lock:
                            task = self._inflight.pop(req, None)
                        if task is not None:
                            task.cancel()

    def _encode_failed(self, msg: Any, exc: M.BusEncodeError) -> None:
        """A request's text or result the bus cannot carry: end that request with an error the
        coordinator can pass on, rather than leave it waiting for a token that never comes."""
        self._warn("encode", "bus message cannot be encoded", kind=msg.KIND.decode(), error=exc.reason)
        req = getattr(msg, "req", None)
        if req is not None and isinstance(msg, (M.Tokens, M.Done)):
            self._queue(M.Error(req=req, message=f"the engine's answer cannot be sent: {exc.reason}"[:8192],
                                status=500, code="encode_failed"))

    def _send_frames(self, frames: list[bytes], kind: str) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK).result()
            return True
        except zmq.Again:
            if self._welcomed:  # before WELCOME, a REGISTER finding no connection yet is the normal case
                self._warn("again", "bus send would block (coordinator not connected or not reading)", kind=kind)
        except Exception as exc:  # ZMQError, or a socket closed under us during shutdown
            self._warn("zmq", "bus send failed", kind=kind, error=str(exc))
        return False

    def _warn(self, key: str, text: str, **fields: Any) -> None:
        """Log a repeated problem at most every 10 s."""
        self._throttle(log, logging.WARNING, key, text, **fields)

    def _register(self) -> M.Register:
        return M.Register(engine=self.settings.name, instance=f"{self.instance}.{self._epoch}", version=__version__,
                          pid=os.getpid(), gpu=self._gpu, http=self.http, rpc=self.rpc,
                          models_on_disk=(disk := self._models_on_disk()), host_weights=self._host,
                          models_fetchable=models_fetchable(self.control, disk),
                          heartbeat_interval_s=self.interval,
                          status=self._status(), token=self._token,
                          device=bound_device(self.settings.device))

    def _models_on_disk(self) -> list[str]:
        return models_on_disk(self.control.registry)

    def _host_weights(self, models: list[str]) -> dict[str, int]:
        return host_weights(self.control, self._gpu, models)

    def _status(self) -> M.EngineStatus:
        return engine_status(self.core, self._speed, self._gpu, self._ticker)

    async def _refresh_gpu(self) -> None:
        """Device memory (it changes with loads) and the GGUFs' tensor tables, read off the loop: ggml
        may block on a busy device, and the tables are Python work queued behind a request's own."""
        with contextlib.suppress(Exception):
            self._gpu = await asyncio.to_thread(local_gpu)
        with contextlib.suppress(Exception):
            self._host = await asyncio.to_thread(self._host_weights, self._models_on_disk())

    def _refresh_in_background(self) -> None:
        """A refresh every :data:`REFRESH_S`, never awaited by the heartbeat: a beat carries the last
        figures read, so a slow read (2 s behind an 8 MiB /tokenize) delays figures, not beats."""
        now = time.monotonic()
        if now - self._gpu_at < REFRESH_S or (self._refreshing is not None and not self._refreshing.done()):
            return
        self._gpu_at = now
        self._refreshing = asyncio.create_task(self._refresh_gpu(), name="bus-link-refresh")

    # ----- heartbeat and liveness ------------------------------------------------------

    async def _beat(self, reader: asyncio.Task[None]) -> None:
        """Heartbeat (or REGISTER until welcomed) until the coordinator has been silent for 3 intervals."""
        next_at = 0.0
        last_key: Any = None
        tick = min(0.1, self.interval / 4)
        while not reader.done():
            now = time.monotonic()
            if now - self._last_heard > LIVENESS * self.interval or self._refused is not None:
                return
            try:  # read from another thread's state: a read that fails is a missed beat, not a lost link
                status = self._status()
            except Exception as exc:  # noqa: BLE001
                self._warn("status", "heartbeat status could not be read", error=repr(exc))
                await asyncio.sleep(tick)
                continue
            key = (status.stage, status.model, status.load_id,
                   round(status.progress, 2) if status.progress is not None else None)
            if (now >= next_at or key != last_key) and not self._closing:
                if now >= next_at:
                    self._refresh_in_background()
                sent = self._send(M.Heartbeat(status=status) if self._welcomed else self._register())
                # a REGISTER that found no connection yet (a reconnect in progress) goes again next tick,
                # so the engine registers as soon as the link is up, not up to an interval later
                next_at = now + (self.interval if sent or self._welcomed else tick)
                last_key = key
            await asyncio.sleep(tick)

    # ----- receiving -------------------------------------------------------------------

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """The socket's one reader: decode, count as life, dispatch; a bad message is logged and dropped."""
        while True:
            try:
                frames = await sock.recv_multipart()
            except zmq.ZMQError as exc:
                log_event(log, logging.WARNING, "bus receive failed", error=str(exc))
                return
            self._last_heard = time.monotonic()
            try:
                msg = await M.decode_aside(frames)
            except M.BusDecodeError as exc:
                if sum(len(f) for f in frames) > M.MAX_BODY:  # its own key: junk must not hide this one
                    self._warn("too-large", "oversized bus message dropped", error=exc.reason)
                else:
                    self._warn("decode", "malformed bus message dropped", error=exc.reason)
                self._refuse_undecodable(frames, exc.reason, on_stream=False)
                continue
            try:
                self._dispatch(msg)
            except Exception as exc:  # a handler bug must not end the reader, or the link goes deaf
                log_event(log, logging.ERROR, "bus message handler failed", kind=msg.KIND.decode(), error=repr(exc),
                          exc_info=True)

    def _dispatch(self, msg: M.Message) -> None:
        if isinstance(msg, M.Ping):
            return
        if isinstance(msg, M.Welcome):
            if not self._welcomed:
                log_event(log, logging.INFO, "registered with the coordinator", coordinator=msg.coordinator,
                          endpoint=self.endpoint)
            self._welcomed = True
            self._refused = None
        elif isinstance(msg, M.StreamOffer):
            if self._welcomed and self._stream is None and not self._closing:
                self._stream = EngineStream(msg.endpoint, self._identity, self._token, self.interval,
                                            self._dispatch_streamed, self._cancel_all, self._warn,
                                            bus_endpoint=self.endpoint,
                                            refuse=lambda f, why: self._refuse_undecodable(f, why, on_stream=True))
                self._stream.start()
        elif isinstance(msg, M.FilesOffer):
            fetcher = getattr(self.control, "fetcher", None)
            if self._welcomed and fetcher is not None:
                host = (self.endpoint or "").partition("://")[2].rpartition(":")[0] or "127.0.0.1"
                fetcher.offer(f"http://{host}:{msg.port}")
        elif isinstance(msg, M.Refused):
            # Drop this connection and retry at the backoff: hammering a coordinator that will say
            # no again helps nobody, but a fixed token file must heal the pool without a restart.
            if not self._welcomed:
                self._refused = msg.reason or "refused"
        elif isinstance(msg, M.Reregister):
            if self._closing:
                return
            log_event(log, logging.INFO, "coordinator asks to register again", reason=msg.reason)
            self._cancel_all()
            self._welcomed = False
            self._send(self._register())
        elif isinstance(msg, M.Generate):
            with self._lock:
                duplicate = msg.req in self._inflight
            if duplicate:
                self._queue(M.Error(req=msg.req, message="duplicate request id", status=409,
                                    code="duplicate_request"))
                return
            self._start_request(msg.req, self._generate(msg))
        elif isinstance(msg, M.Cancel):
            with self._lock:
                task = self._inflight.pop(msg.req, None)
            if task is not None:
                task.cancel()
        elif isinstance(msg, M.Configure):
            t = asyncio.create_task(self._configure(msg), name=f"bus-configure-{msg.req}")
            self._side.add(t)
            t.add_done_callback(self._side.discard)
        else:
            self._warn(f"unexpected-{msg.KIND!r}", "unexpected bus message for an engine dropped",
                       kind=msg.KIND.decode())

    def _dispatch_streamed(self, msg: M.Message) -> None:
        """A GENERATE or CANCEL that came on the request stream: its request answers on the stream."""
        with self._lock:
            if isinstance(msg, M.Generate) and msg.req not in self._inflight:
                self._on_stream.add(msg.req)
        self._dispatch(msg)

    def _refuse_undecodable(self, frames: list[bytes], reason: str, on_stream: bool) -> None:
        """A GENERATE this engine cannot read (another release's field, a value out of bounds): answer
        its request with a 400 at once, the way it came, rather than leave it waiting for a token."""
        req = M.generate_request_of(frames)
        if req is None:
            return
        with self._lock:
            if req in self._inflight:
                return
            if on_stream:
                self._on_stream.add(req)
        self._queue(M.Error(req=req, status=400, code="bad_request",
                            message=f"the engine could not read this request: {reason}"[:8192]))
        with self._lock:
            self._on_stream.discard(req)

    def _start_request(self, req: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a request's coroutine on the main loop (on this loop when the link has no pulse of its own),
        known in ``_inflight`` until it ends so that CANCEL, a lost stream or a failed send can stop it."""
        main = self._main_loop
        running = asyncio.get_running_loop()
        fut: asyncio.Future[None] | concurrent.futures.Future[None]
        if main is None or main is running:
            fut = running.create_task(coro, name=f"bus-gen-{req}")
        else:
            fut = asyncio.run_coroutine_threadsafe(coro, main)
        with self._lock:
            self._inflight[req] = fut
        fut.add_done_callback(lambda f: self._forget(req, f))

    def _forget(self, req: str, fut: Any) -> None:
        with self._lock:
            if self._inflight.get(req) is fut:
                del self._inflight[req]
                self._on_stream.discard(req)  # what it queued keeps its way (see _queue)

    async def _on_main(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the main loop, where the engine's control and load records live."""
        main = self._main_loop
        if main is None or main is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, main))

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _cancel_all(self) -> None:
        with self._lock:
            tasks = list(self._inflight.values())
            self._inflight.clear()
            self._on_stream.clear()
        for task in tasks:
            task.cancel()

    # ----- handlers --------------------------------------------------------------------

    async def _generate(self, msg: M.Generate) -> None:
        req = msg.req
        try:
            if msg.model and not self.control.serves(msg.model):
                serving = self.core.snapshot().model_id
                self._queue(M.Error(req=req, status=503, code="model_not_loaded",
                                    message=f"engine {self.settings.name} serves "
                                            f"{serving or 'no model'}, not '{msg.model}'"))
                return
            request = msg.to_request()
            if self.core.asleep is not None:  # the idle sleep freed the model: load it while this is prepared
                self.control.wake()
            try:
                await self.core.prepare(request)  # a long prompt is tokenized off the engine thread
            except RequestRefused as exc:
                self._queue(M.Error(req=req, status=exc.status, code=exc.code, message=str(exc),
                                    n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx, param=exc.param))
                return
            handle = self.core.submit(request)
            try:
                while True:
                    batch = [await handle.queue.get()]
                    while not isinstance(batch[-1], END) and not handle.queue.empty():
                        batch.append(handle.queue.get_nowait())
                    for ev in batch:
                        if isinstance(ev, Progress):
                            self._queue(M.Progress(req=req, total=ev.total, cache=ev.cache, processed=ev.processed,
                                                   time_ms=ev.time_ms, slot=ev.slot))
                    step = step_tokens(req, batch, request.logprobs is not None, request.return_tokens)
                    if step is not None and not self._queue(step):
                        return  # nobody to stream to: the finally cancels it in the core
                    last = batch[-1]
                    if isinstance(last, Done):
                        handle.finished = True
                        self._queue(M.Done.of(req, last))
                        return
                    if isinstance(last, Failed):
                        handle.finished = True
                        self._queue(M.Error.of(req, last))
                        return
            finally:
                if not handle.finished:
                    self.core.cancel(handle)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log_event(log, logging.ERROR, "bus request failed", req=req, error=repr(exc), exc_info=True)
            self._queue(M.Error(req=req, message=f"engine error: {exc}"[:8192], status=500, code="internal_error"))

    async def _configure(self, msg: M.Configure) -> None:
        req = msg.req

        def refuse(status: int, code: str, exc: Exception) -> None:
            self._send(M.ConfigureReply(req=req, ok=False, status=status, code=code, message=str(exc)[:8192]))

        try:
            result = await self._on_main(self.control.configure(dict(msg.payload)))
        except Exception as exc:
            r = refusal(exc)
            if r is not None:
                return refuse(r.http, r.code, exc)
            log_event(log, logging.ERROR, "bus configure failed", req=req, error=repr(exc), exc_info=True)
            return refuse(500, "configure_failed", exc)
        body = result.public()
        self._send(M.ConfigureReply(req=req, ok=True, result=body))
        if result.load_id is None:
            return
        rec = self.core.loads.get(result.load_id)
        if rec is None:
            return
        await self._on_main(rec.wait())
        if self._welcomed:  # the status first, so the coordinator's view has the new model when it hears LOADED
            self._send(M.Heartbeat(status=self._status()))
        self._send(M.LoadDone(req=req, load_id=rec.id, phase=rec.phase, model=rec.model, seconds=rec.seconds,
                              error=(rec.error or None) and str(rec.error)[:8192]))

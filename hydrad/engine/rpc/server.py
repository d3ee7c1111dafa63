"""The merged RPC port: one TCP listener, the first byte of each connection picks the protocol.

``0x0E`` (ggml-RPC HELLO) goes to the ggml relay (hydrad/engine/rpc/ggml_relay.py), which checks each
command before llama.cpp's in-process server sees it; ``0x30–0x46`` are Hydra's binary ops
(docs/rpc-protocol.md); anything else is closed. Sockets are blocking and served by threads, kept
between connections (hydrad/engine/rpc/workers.py): the relay is on the per-token path of a peer's
compute, where a thread doing recv/sendall beats an event-loop hop. Handlers that need the engine hop onto the event loop with run_coroutine_threadsafe.

Every connection is gated like HTTP ``/control``: the peer address must be inside
``control_allow_from``, and on an engine with a token a control connection must open with HELLO
carrying it. Until a connection has identified itself (a complete first request, and the token
where one is needed) it is *pending*: it has ``handshake_timeout_s`` to do so, and pending
connections have their own small bound (the oldest is dropped), so idle sockets can never use up
the places of identified sessions, which alone count against ``max_control_connections``. An
identified session that sends nothing for ``control_idle_timeout_s`` is closed, and when every place
is taken the session idle the longest gives its place to a newcomer (``places.py``): sessions that
said HELLO and then went quiet can no longer hold a configure off.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable

from hydrad import __version__
from hydrad.engine.gpu import bound_device
from hydrad.engine.control import EngineControl
from hydrad.engine.refusals import refusal
from hydrad.engine.core import StateError
from hydrad.common.logs import LogThrottle, log_event
from hydrad.wire import protocol as P
from hydrad.engine.rpc.ggml_relay import GgmlRelay
from hydrad.engine.rpc.places import ControlPlaces
from hydrad.engine.rpc.workers import ConnectionWorkers
from hydrad.wire.kvstream import StateReceiver, chunked
from hydrad.engine.settings import EngineSettings
from hydrad.wire.errors import STATE_STATUS

log = logging.getLogger("hydrad.rpc")


def tune(sock: socket.socket) -> None:
    """TCP_NODELAY (a 3–9× loss without it on ggml-RPC) and keepalive on every accepted socket."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


class _Closed(Exception):
    pass


def _spare_fd() -> int | None:
    """A descriptor held in reserve for when the limit is reached (see _accept_loop)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class MergedPort:
    def __init__(self, settings: EngineSettings, control: EngineControl, loop: asyncio.AbstractEventLoop,
                 ggml_endpoint: tuple[str, int] | None, devices: Callable[[], list[dict[str, Any]]]) -> None:
        self.settings = settings
        self.control = control
        self.loop = loop
        self.ggml_endpoint = ggml_endpoint
        self.devices = devices
        self.rpc = settings.rpc
        self.relay = GgmlRelay(settings, ggml_endpoint) if ggml_endpoint is not None else None
        self._places = ControlPlaces(self.rpc.max_control_connections)
        self._pending: OrderedDict[int, socket.socket] = OrderedDict()  # not yet identified, oldest first
        self._pending_lock = threading.Lock()
        self._ids = iter(range(1, 1 << 62))
        self._throttle = LogThrottle()  # what a stranger can repeat at will is logged once per 10 s
        self._workers = ConnectionWorkers(self._dispatch, lambda fn: self._spawn(fn))
        self._sock: socket.socket | None = None
        self._closing = False
        self.port = 0
        self.stats = {"ggml_connections": 0, "control_connections": 0, "busy_rejections": 0, "closed_unknown": 0,
                      "forbidden": 0, "handshake_timeouts": 0, "pending_dropped": 0, "spawn_failures": 0,
                      "fd_exhausted": 0}

    # ----- accept and dispatch ------------------------------------------------------------

    def start(self) -> int:
        host = self.rpc.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, self.rpc.port))
        s.listen(128)
        self._sock = s
        self.port = s.getsockname()[1]
        if self.relay is not None:
            self.relay.start()
            self.control.core.pairing.lend_through(self.relay.public)
        threading.Thread(target=self._accept_loop, name="hydrad-rpc-accept", daemon=True).start()
        return self.port

    def close(self) -> None:
        self._closing = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        self._workers.close()
        if self.relay is not None:
            self.relay.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        """Start a connection worker's thread (the seam where a thread that cannot start shows up)."""
        threading.Thread(target=target, args=args, name="hydrad-rpc-conn", daemon=True).start()

    def _accept_loop(self) -> None:
        """Never dies while the port is open: a failed accept is retried, and a connection for which no
        worker is idle and none can start (threads or memory exhausted) is answered BUSY and closed.

        Out of file descriptors (EMFILE, ENFILE) the loop logs it (once per 10 s) and goes on trying:
        the port serves again as soon as descriptors are free. The connection at the head of the queue
        would wait there, and the ones behind it: a spare descriptor kept for the purpose is closed,
        that connection accepted and closed at once (its peer learns now, as uvloop does for HTTP)
        and the spare reopened. Best effort: another thread of the process may take the freed
        descriptor first (llama.cpp's ggml-RPC server retries its accepts without pause)."""
        assert self._sock is not None
        spare = _spare_fd()
        while not self._closing:
            try:
                conn, addr = self._sock.accept()
            except OSError as exc:
                if self._closing:
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self.stats["fd_exhausted"] += 1
                    spare, peer = self._shed(spare)
                    self._throttle(log, logging.WARNING, "fd", "out of file descriptors: merged-port connections "
                                   "wait or are closed unserved until some are free", error=exc.strerror or str(exc),
                                   closed=peer or "-", fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
                time.sleep(0.05)
                continue
            try:
                self._workers.submit(conn, addr)
            except BaseException as exc:  # RuntimeError("can't start new thread"), MemoryError, ...
                self.stats["spawn_failures"] += 1
                log_event(log, logging.ERROR, "cannot start a connection thread; answered BUSY", error=repr(exc))
                try:
                    conn.settimeout(0.2)
                    self._send_quietly(conn, P.error_frame(P.Status.BUSY, "busy",
                                                           "the engine cannot take a connection now; retry later"))
                finally:
                    conn.close()
                if not isinstance(exc, Exception):
                    raise

    def _shed(self, spare: int | None) -> tuple[int | None, str | None]:
        """Close the connection at the head of the accept queue with the spare descriptor: a new spare,
        and the peer of the connection closed (None when none could be taken)."""
        if spare is not None:
            os.close(spare)
        peer = None
        try:
            conn, addr = self._sock.accept()  # type: ignore[union-attr]
            conn.close()
            peer = addr[0] if isinstance(addr, tuple) else str(addr)
        except OSError:
            pass
        return _spare_fd(), peer

    def _pend(self, conn: socket.socket) -> int:
        """Count a connection as pending; beyond the bound the oldest pending one is dropped."""
        key = next(self._ids)
        victim = None
        with self._pending_lock:
            self._pending[key] = conn
            if len(self._pending) > self.rpc.max_pending_connections:
                _, victim = self._pending.popitem(last=False)
        if victim is not None:
            self.stats["pending_dropped"] += 1
            try:
                victim.shutdown(socket.SHUT_RDWR)  # wakes its thread, which closes it
            except OSError:
                pass
        return key

    def _unpend(self, key: int) -> bool:
        """Leave the pending set; False when the connection was dropped meanwhile."""
        with self._pending_lock:
            return self._pending.pop(key, None) is not None

    def _dispatch(self, conn: socket.socket, addr: Any) -> None:
        peer = addr[0] if isinstance(addr, tuple) else str(addr)
        deadline = time.monotonic() + self.rpc.handshake_timeout_s
        key = self._pend(conn)
        try:
            self._serve(conn, peer, deadline, key)
        except Exception as exc:  # never let a connection's failure escape its thread unlogged
            log_event(log, logging.ERROR, "connection failed", peer=peer, error=repr(exc), exc_info=True)
        finally:
            self._unpend(key)
            conn.close()

    def _serve(self, conn: socket.socket, peer: str, deadline: float, key: int) -> None:
        try:
            tune(conn)
            conn.settimeout(max(0.01, min(self.rpc.first_byte_timeout_s, deadline - time.monotonic())))
            first = conn.recv(1, socket.MSG_PEEK)
        except OSError:
            self.stats["handshake_timeouts"] += 1
            return
        if not first:
            return
        code = first[0]
        if code != P.GGML_RPC_HELLO and code not in P.FIRST_OPS:
            self.stats["closed_unknown"] += 1
            self._throttle(log, logging.WARNING, f"unknown:{peer}", "unknown first byte; closing", peer=peer,
                           byte=f"0x{code:02x}")
            return
        if not self.settings.allows_control(peer):
            self.stats["forbidden"] += 1
            self._throttle(log, logging.WARNING, f"refused:{peer}", "merged port refused", peer=peer,
                           reason="not in control_allow_from", protocol="ggml-RPC" if code == P.GGML_RPC_HELLO else "hydra")
            if code != P.GGML_RPC_HELLO:
                self._send_quietly(conn, P.error_frame(P.Status.UNAUTHORIZED, "forbidden",
                                                       f"the merged port is not open to {peer} (control_allow_from)"))
            return
        if code == P.GGML_RPC_HELLO:
            if self.relay is None:
                log_event(log, logging.WARNING, "ggml-RPC refused", peer=peer, reason="no ggml RPC server")
                return
            self.stats["ggml_connections"] += 1
            self.relay.serve(conn, peer, deadline, lambda: self._unpend(key))
            return
        self._control(conn, peer, deadline, key)

    @staticmethod
    def _send_quietly(conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            pass

    # ----- Hydra ops ----------------------------------------------------------------------

    def _control(self, conn: socket.socket, peer: str, deadline: float, key: int) -> None:
        """A Hydra control connection: identify (first complete request; HELLO with the token when the
        engine has one) before the deadline, take one of the session places, then serve ops."""
        io = _FrameIO(conn, P.REQUEST_CODES)
        trusted = False
        session = False
        try:
            try:
                frame = io.next(deadline=deadline)
            except OSError:
                self.stats["handshake_timeouts"] += 1
                io.send_quietly(P.error_frame(P.Status.PROTOCOL_ERROR, "handshake_timeout",
                                              f"no complete request within {self.rpc.handshake_timeout_s}s"))
                return
            if frame is None:
                return
            if self.rpc.token is not None:
                if frame.code != P.Op.HELLO or not self._token_ok(frame):
                    io.send(P.error_frame(P.Status.UNAUTHORIZED, "unauthorized",
                                          "this engine needs HELLO with a valid token first"))
                    return
                trusted = True
            if not self._unpend(key):
                return  # dropped as the oldest pending connection meanwhile
            if not self._places.take(key, conn):
                self.stats["busy_rejections"] += 1
                io.send_quietly(P.error_frame(P.Status.BUSY, "busy", f"{self.rpc.max_control_connections} control "
                                              "sessions are each inside a request; retry later"))
                return
            session = True
            self.stats["control_connections"] += 1
            conn.settimeout(self.rpc.control_idle_timeout_s)  # an idle session gives its place back
            while frame is not None:
                if not self._places.busy(key):
                    return  # closed while idle to make room for another session
                try:
                    if not self._op(frame, io, peer, trusted):
                        return
                finally:
                    self._places.idle(key)
                frame = io.next()
        except P.ProtocolError as exc:
            io.send_quietly(P.error_frame(exc.status, "protocol_error", str(exc)))
        except _Closed:
            pass
        except OSError:
            pass
        except Exception as exc:  # a handler bug must not kill the listener or leave the peer hanging
            log_event(log, logging.ERROR, "control op failed", peer=peer, error=repr(exc), exc_info=True)
            io.send_quietly(P.error_frame(P.Status.ERROR, "internal_error", "internal error (see the engine log)"))
        finally:
            if session:
                self._places.leave(key)

    def _token_ok(self, frame: P.Frame) -> bool:
        try:
            token = frame.json().get("token")
        except P.ProtocolError:
            return False
        return isinstance(token, str) and self.settings.token_ok(token)

    def _hello(self) -> dict[str, Any]:
        return {"version": P.PROTOCOL_VERSION, "engine": self.settings.name, "server": f"hydrad {__version__}",
                "chunk_size": self.rpc.chunk_size, "max_control_payload": P.MAX_CONTROL_PAYLOAD,
                "max_data_payload": P.MAX_DATA_PAYLOAD}

    def _run(self, coro: Any, timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _op(self, frame: P.Frame, io: "_FrameIO", peer: str, trusted: bool) -> bool:
        """Serve one request; False closes the connection."""
        op = frame.code
        req = frame.json()  # every op's payload is a JSON object; anything else is BAD_REQUEST
        if op == P.Op.HELLO:
            major = req.get("version", P.PROTOCOL_VERSION)
            if major != P.PROTOCOL_VERSION:
                io.send(P.error_frame(P.Status.ERROR, "version_mismatch",
                                      f"client speaks version {major}; this engine speaks {P.PROTOCOL_VERSION}"))
                return False
            io.send(P.encode_json(P.Status.OK, self._hello()))
        elif op == P.Op.INFO:
            io.send(P.encode_json(P.Status.OK, self._run(self._info())))
        elif op == P.Op.ENGINE_CONFIGURE:
            io.send(self._configure(req))
        elif op == P.Op.STATE_GET:
            self._state_get(req, io)
        elif op == P.Op.STATE_PUT:
            return self._state_put(req, io, trusted)
        elif op == P.Op.SWAP_QUANT:
            io.send(self._swap_quant(req))
        elif op == P.Op.SET_EXPERT_MODE:
            io.send(self._set_expert_mode(req))
        elif op == P.Op.PIPELINE_ATTACH:
            io.send(P.error_frame(P.Status.ERROR, "retired",
                                  "PIPELINE_ATTACH is retired; to split a model across engines (COMBINE), send "
                                  "ENGINE_CONFIGURE (0x40) to the head with rpc_servers (the peers' merged ports) "
                                  "and tensor_split or override_tensors"))
        else:
            io.send(P.error_frame(P.Status.BAD_REQUEST, "unexpected_op",
                                  f"op 0x{op:02x} is only valid inside a STATE_PUT stream"))
            return False
        return True

    def _control_op(self, op: Callable[[], Any]) -> bytes:
        """Run a control coroutine; a refusal answers with its status (refusals.py), anything else raises."""
        try:
            result = self._run(op())
        except Exception as exc:
            r = refusal(exc)
            if r is None:
                raise
            return P.error_frame(r.status, r.code, r.message)
        return P.encode_json(P.Status.OK, result if isinstance(result, dict) else result.public())

    def _configure(self, payload: dict[str, Any]) -> bytes:
        return self._control_op(lambda: self.control.configure(payload))

    def _swap_quant(self, req: dict[str, Any]) -> bytes:
        model = req.get("model")
        if not isinstance(model, str):
            return P.error_frame(P.Status.BAD_REQUEST, "invalid_field", "SWAP_QUANT needs {\"model\": <alias or GGUF path>}")
        return self._control_op(lambda: self.control.swap_quant(model))

    def _set_expert_mode(self, req: dict[str, Any]) -> bytes:
        unknown = sorted(set(req) - {"mode", "peer", "override_tensors"})
        if unknown:
            return P.error_frame(P.Status.BAD_REQUEST, "unsupported_field",
                                 f"unknown field(s): {', '.join(unknown)} (mode, peer, override_tensors)")
        return self._control_op(lambda: self.control.set_expert_mode(req.get("mode"), req.get("peer"),
                                                                  req.get("override_tensors")))

    async def _info(self) -> dict[str, Any]:
        view = info_view(self.control, self.settings, self.devices(), self.port)
        view["rpc"]["ggml_relay"] = self.relay.public() if self.relay is not None else None
        return view

    def _state_get(self, req: dict[str, Any], io: "_FrameIO") -> None:
        slot = req.get("slot")
        if not isinstance(slot, int):
            io.send(P.error_frame(P.Status.BAD_REQUEST, "invalid_slot", "STATE_GET needs {\"slot\": <int>}"))
            return
        try:
            meta, data = self._run(self.control.core.state_get(slot))
        except StateError as exc:
            io.send(P.error_frame(STATE_STATUS[exc.kind], exc.kind, str(exc)))
            return
        for piece in chunked(meta, data, self.rpc.chunk_size):
            io.send(piece)

    def _state_put(self, req: dict[str, Any], io: "_FrameIO", trusted: bool) -> bool:
        """Restore a slot. ``trusted``: the peer proved the engine's token; a state from anyone else is
        restored as *foreign* (see Slot.foreign): only requests pinned to that slot reuse it."""
        slot, meta = req.get("slot"), req.get("meta")
        if not isinstance(slot, int) or not isinstance(meta, dict):
            io.send(P.error_frame(P.Status.BAD_REQUEST, "invalid_request", "STATE_PUT needs {\"slot\": <int>, \"meta\": {...}}"))
            return True
        core = self.control.core
        refused = core.check_put(slot, meta, self.rpc.max_state_bytes)
        if refused is not None:
            io.send(P.error_frame(STATE_STATUS[refused.kind], refused.kind, str(refused)))
            return True
        rx = StateReceiver(meta["bytes"], self.control.core.state_buffers.take)
        io.send(P.encode_json(P.Status.CONTINUE, {"slot": slot}))
        while True:
            frame = io.next(data_into=rx)
            if frame is None:
                raise _Closed()
            if frame.code == P.Op.STATE_DATA:
                continue  # payload already landed in rx
            if frame.code == P.Op.STATE_END:
                break
            raise P.ProtocolError(f"op 0x{frame.code:02x} inside a STATE_PUT stream", P.Status.BAD_REQUEST)
        problem = rx.verify(frame.json())
        if problem:
            io.send(P.error_frame(P.Status.BAD_REQUEST, "state_mismatch", problem + "; the slot is unchanged"))
            return True
        try:
            result = self._run(core.state_put(slot, meta, rx.buffer, trusted=trusted))
        except StateError as exc:
            io.send(P.error_frame(STATE_STATUS[exc.kind], exc.kind, str(exc)))
            return True
        except RuntimeError as exc:
            io.send(P.error_frame(P.Status.ERROR, "restore_failed", str(exc)))
            return True
        io.send(P.encode_json(P.Status.OK, {**result, "trusted": trusted}))
        return True


def info_view(control: EngineControl, settings: EngineSettings, devices: list[dict[str, Any]], port: int) -> dict[str, Any]:
    core = control.core
    snap = core.snapshot()
    m = snap.model
    model = None
    slots: list[dict[str, Any]] = []
    if m is not None:
        model = {"id": m.id, "path": m.path, "arch": m.arch, "desc": m.desc, "n_params": m.n_params,
                 "size_bytes": m.size_bytes, "n_layer": m.n_layer, "n_embd": m.n_embd, "n_head_kv": m.n_head_kv,
                 "n_ctx_train": m.n_ctx_train, "fingerprint": m.fingerprint,
                 "family": m.family, "weights": m.weights}
        slots = [{k: row[k] for k in ("id", "busy", "n_tokens", "foreign")} for row in core.slot_rows()]
    rec = core.loads.get(snap.load_id) if snap.load_id is not None else None
    return {"engine": settings.name, "version": __version__, "stage": snap.stage, "progress": snap.progress,
            "model": model, "generation": snap.generation, "slots": slots,
            "params": control.layers.sources(), "last_error": snap.last_error,
            "reload": rec.public() if rec is not None else None,
            "device": bound_device(settings.device),  # the GPU binding in force; None = every GPU of the host
            "combine": core.pairing.view(snap),
            "prefix": core.prefix.public(),  # prefix checkpoints: shared between slots, from and to the Store
            "rpc": {"port": port, "ggml_rpc_devices": devices}}


class _FrameIO:
    """Blocking frame reader/writer over one socket, built on the sans-IO decoder."""

    def __init__(self, conn: socket.socket, codes: frozenset[int]) -> None:
        self.conn = conn
        self.decoder = P.FrameDecoder(codes)
        self.frames: deque[P.Frame] = deque()
        self.buf = bytearray(1 << 20)

    def next(self, data_into: StateReceiver | None = None, deadline: float | None = None) -> P.Frame | None:
        """The next frame; None at a clean end. With ``deadline`` (monotonic), a frame not complete by then
        raises TimeoutError (a peer trickling a byte at a time cannot stretch it)."""
        while not self.frames:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("deadline passed")
                self.conn.settimeout(left)
            n = self.conn.recv_into(self.buf)
            if n == 0:
                self.decoder.eof()
                return None
            self.frames.extend(self.decoder.feed(memoryview(self.buf)[:n]))
        frame = self.frames.popleft()
        if data_into is not None and frame.code == P.Op.STATE_DATA:
            data_into.add(frame.payload)
        return frame

    def send(self, data: bytes | memoryview) -> None:
        try:
            self.conn.sendall(data)
        except OSError as exc:
            raise _Closed() from exc

    def send_quietly(self, data: bytes) -> None:
        try:
            self.conn.sendall(data)
        except OSError:
            pass


__all__ = ["MergedPort", "tune", "info_view"]

"""The merged RPC port: one TCP listener, the first byte of each connection picks the protocol.

``0x0E`` (ggml-RPC HELLO) is relayed byte for byte to llama.cpp's ggml RPC server running
in-process on a loopback port; ``0x30–0x46`` are Hydra's binary ops (docs/rpc-protocol.md);
anything else is closed. Sockets are blocking and served by threads: the relay is on the
per-token path of a peer's compute, where a thread doing recv/sendall beats an event-loop hop.
Control connections are bounded (excess gets BUSY); an accepted compute connection is never
dropped. Handlers that need the engine hop onto the event loop with run_coroutine_threadsafe.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import threading
import time
from collections import deque
from typing import Any, Callable

from hydrad import __version__
from hydrad.engine.control import EngineBusy, EngineControl, ParamError, UnknownModel
from hydrad.engine.core import StateError
from hydrad.logs import log_event
from hydrad.rpc import protocol as P
from hydrad.rpc.state import StateReceiver, chunked
from hydrad.settings import EngineSettings

log = logging.getLogger("hydrad.rpc")

_STATE_STATUS = {"not_found": P.Status.NOT_FOUND, "conflict": P.Status.CONFLICT,
                 "incompatible": P.Status.INCOMPATIBLE, "too_large": P.Status.TOO_LARGE, "failed": P.Status.ERROR}


def tune(sock: socket.socket) -> None:
    """TCP_NODELAY (a 3–9× loss without it on ggml-RPC) and keepalive on every accepted socket."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


class _Closed(Exception):
    pass


class MergedPort:
    def __init__(self, settings: EngineSettings, control: EngineControl, loop: asyncio.AbstractEventLoop,
                 ggml_endpoint: tuple[str, int] | None, devices: Callable[[], list[dict[str, Any]]]) -> None:
        self.settings = settings
        self.control = control
        self.loop = loop
        self.ggml_endpoint = ggml_endpoint
        self.devices = devices
        self.rpc = settings.rpc
        self._control_slots = threading.BoundedSemaphore(self.rpc.max_control_connections)
        self._sock: socket.socket | None = None
        self._closing = False
        self.port = 0
        self.stats = {"ggml_connections": 0, "control_connections": 0, "busy_rejections": 0, "closed_unknown": 0}

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

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                if self._closing:
                    return
                time.sleep(0.05)
                continue
            threading.Thread(target=self._dispatch, args=(conn, addr), name="hydrad-rpc-conn", daemon=True).start()

    def _dispatch(self, conn: socket.socket, addr: Any) -> None:
        peer = addr[0] if isinstance(addr, tuple) else str(addr)
        try:
            tune(conn)
            conn.settimeout(self.rpc.first_byte_timeout_s)
            first = conn.recv(1, socket.MSG_PEEK)
            conn.settimeout(None)
        except OSError:
            conn.close()
            return
        if not first:
            conn.close()
            return
        code = first[0]
        if code == P.GGML_RPC_HELLO:
            self._ggml(conn, peer)
        elif code in P.FIRST_OPS:
            if not self._control_slots.acquire(blocking=False):
                self.stats["busy_rejections"] += 1
                self._send_quietly(conn, P.error_frame(P.Status.BUSY, "busy",
                                   f"more than {self.rpc.max_control_connections} control connections; retry later"))
                conn.close()
                return
            try:
                self.stats["control_connections"] += 1
                self._control(conn, peer)
            finally:
                self._control_slots.release()
        else:
            self.stats["closed_unknown"] += 1
            log_event(log, logging.WARNING, "unknown first byte; closing", peer=peer, byte=f"0x{code:02x}")
            conn.close()

    @staticmethod
    def _send_quietly(conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            pass

    # ----- ggml-RPC relay -------------------------------------------------------------------

    def _ggml(self, conn: socket.socket, peer: str) -> None:
        if self.ggml_endpoint is None or not self.settings.allows_control(peer):
            log_event(log, logging.WARNING, "ggml-RPC refused", peer=peer,
                      reason="no ggml RPC server" if self.ggml_endpoint is None else "not in control_allow_from")
            conn.close()
            return
        upstream = None
        deadline = time.monotonic() + 3.0  # the in-process server may still be binding right after boot
        while upstream is None:
            try:
                upstream = socket.create_connection(self.ggml_endpoint, timeout=5)
                upstream.settimeout(None)
            except OSError as exc:
                if time.monotonic() > deadline:
                    log_event(log, logging.ERROR, "ggml RPC server unreachable", error=str(exc))
                    conn.close()
                    return
                time.sleep(0.05)
        tune(upstream)
        self.stats["ggml_connections"] += 1
        log_event(log, logging.INFO, "ggml-RPC connection", peer=peer)
        t = threading.Thread(target=_pump, args=(upstream, conn), name="hydrad-rpc-relay-up", daemon=True)
        t.start()
        _pump(conn, upstream)
        t.join()

    # ----- Hydra ops ----------------------------------------------------------------------

    def _control(self, conn: socket.socket, peer: str) -> None:
        io = _FrameIO(conn, P.REQUEST_CODES)
        authed = not self.rpc.token
        try:
            while True:
                frame = io.next()
                if frame is None:
                    return
                if not authed:
                    if frame.code != P.Op.HELLO or not self._token_ok(frame):
                        io.send(P.error_frame(P.Status.UNAUTHORIZED, "unauthorized",
                                              "this engine needs HELLO with a valid token first"))
                        return
                    authed = True
                    if not self._op(frame, io, peer):  # the HELLO itself: version check and answer
                        return
                    continue
                if not self._op(frame, io, peer):
                    return
        except P.ProtocolError as exc:
            io.send_quietly(P.error_frame(exc.status, "protocol_error", str(exc)))
        except _Closed:
            pass
        except Exception as exc:  # a handler bug must not kill the listener or leave the peer hanging
            log_event(log, logging.ERROR, "control op failed", peer=peer, error=repr(exc), exc_info=True)
            io.send_quietly(P.error_frame(P.Status.ERROR, "internal_error", "internal error (see the engine log)"))
        finally:
            conn.close()

    def _token_ok(self, frame: P.Frame) -> bool:
        try:
            token = frame.json().get("token")
        except P.ProtocolError:
            return False
        return isinstance(token, str) and hmac.compare_digest(token.encode(), (self.rpc.token or "").encode())

    def _hello(self) -> dict[str, Any]:
        return {"version": P.PROTOCOL_VERSION, "engine": self.settings.name, "server": f"hydrad {__version__}",
                "chunk_size": self.rpc.chunk_size, "max_control_payload": P.MAX_CONTROL_PAYLOAD,
                "max_data_payload": P.MAX_DATA_PAYLOAD}

    def _run(self, coro: Any, timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _op(self, frame: P.Frame, io: "_FrameIO", peer: str) -> bool:
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
            if not self.settings.allows_control(peer):
                io.send(P.error_frame(P.Status.UNAUTHORIZED, "forbidden", f"configure is not allowed from {peer}"))
                return True
            io.send(self._configure(req))
        elif op == P.Op.STATE_GET:
            self._state_get(req, io)
        elif op == P.Op.STATE_PUT:
            if not self.settings.allows_control(peer):
                io.send(P.error_frame(P.Status.UNAUTHORIZED, "forbidden", f"STATE_PUT is not allowed from {peer}"))
                return True
            return self._state_put(req, io)
        elif op == P.Op.SWAP_QUANT:
            if not self.settings.allows_control(peer):
                io.send(P.error_frame(P.Status.UNAUTHORIZED, "forbidden", f"SWAP_QUANT is not allowed from {peer}"))
                return True
            io.send(self._swap_quant(req))
        elif op == P.Op.SET_EXPERT_MODE:
            name = P.Op(op).name
            io.send(P.error_frame(P.Status.NOT_SUPPORTED, "not_supported", f"{name} is not supported by this engine yet"))
        elif op == P.Op.PIPELINE_ATTACH:
            io.send(P.error_frame(P.Status.ERROR, "retired",
                                  "PIPELINE_ATTACH is retired: use ENGINE_CONFIGURE (0x40) with rpc_servers and tensor_split"))
        else:
            io.send(P.error_frame(P.Status.BAD_REQUEST, "unexpected_op",
                                  f"op 0x{op:02x} is only valid inside a STATE_PUT stream"))
            return False
        return True

    def _configure(self, payload: dict[str, Any]) -> bytes:
        try:
            result = self._run(self.control.configure(payload))
        except ParamError as exc:
            return P.error_frame(P.Status.BAD_REQUEST, exc.code, str(exc))
        except UnknownModel as exc:
            return P.error_frame(P.Status.NOT_FOUND, "model_not_found", str(exc))
        except EngineBusy as exc:
            return P.error_frame(P.Status.CONFLICT, "busy", str(exc))
        return P.encode_json(P.Status.OK, result.public())

    def _swap_quant(self, req: dict[str, Any]) -> bytes:
        model = req.get("model")
        if not isinstance(model, str):
            return P.error_frame(P.Status.BAD_REQUEST, "invalid_field", "SWAP_QUANT needs {\"model\": <alias or GGUF path>}")
        try:
            result = self._run(self.control.swap_quant(model))
        except ParamError as exc:
            return P.error_frame(P.Status.INCOMPATIBLE if exc.code == "not_sibling" else P.Status.BAD_REQUEST,
                                 exc.code, str(exc))
        except UnknownModel as exc:
            return P.error_frame(P.Status.NOT_FOUND, "model_not_found", str(exc))
        except EngineBusy as exc:
            return P.error_frame(P.Status.CONFLICT, "busy", str(exc))
        return P.encode_json(P.Status.OK, result.public())

    async def _info(self) -> dict[str, Any]:
        return info_view(self.control, self.settings, self.devices(), self.port)

    def _state_get(self, req: dict[str, Any], io: "_FrameIO") -> None:
        slot = req.get("slot")
        if not isinstance(slot, int):
            io.send(P.error_frame(P.Status.BAD_REQUEST, "invalid_slot", "STATE_GET needs {\"slot\": <int>}"))
            return
        try:
            meta, data = self._run(self.control.core.state_get(slot))
        except StateError as exc:
            io.send(P.error_frame(_STATE_STATUS[exc.kind], exc.kind, str(exc)))
            return
        for piece in chunked(meta, data, self.rpc.chunk_size):
            io.send(piece)

    def _state_put(self, req: dict[str, Any], io: "_FrameIO") -> bool:
        slot, meta = req.get("slot"), req.get("meta")
        if not isinstance(slot, int) or not isinstance(meta, dict):
            io.send(P.error_frame(P.Status.BAD_REQUEST, "invalid_request", "STATE_PUT needs {\"slot\": <int>, \"meta\": {...}}"))
            return True
        core = self.control.core
        refused = core.check_put(slot, meta, self.rpc.max_state_bytes)
        if refused is not None:
            io.send(P.error_frame(_STATE_STATUS[refused.kind], refused.kind, str(refused)))
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
            result = self._run(core.state_put(slot, meta, rx.buffer))
        except StateError as exc:
            io.send(P.error_frame(_STATE_STATUS[exc.kind], exc.kind, str(exc)))
            return True
        except RuntimeError as exc:
            io.send(P.error_frame(P.Status.ERROR, "restore_failed", str(exc)))
            return True
        io.send(P.encode_json(P.Status.OK, result))
        return True


def info_view(control: EngineControl, settings: EngineSettings, devices: list[dict[str, Any]], port: int) -> dict[str, Any]:
    core = control.core
    gen = core.gen
    model = None
    slots: list[dict[str, Any]] = []
    if gen is not None:
        info = gen.model.info
        model = {"id": gen.resolved.id, "path": info.path, "arch": info.arch, "desc": info.desc,
                 "n_params": info.n_params, "size_bytes": info.size_bytes, "n_layer": info.n_layer,
                 "n_embd": info.n_embd, "n_head_kv": info.n_head_kv, "n_ctx_train": info.n_ctx_train,
                 "fingerprint": gen.fingerprint}
        slots = [{"id": s.id, "busy": s.active is not None, "n_tokens": len(s.cache)} for s in gen.slots]
    return {"engine": settings.name, "version": __version__, "stage": core.stage, "progress": core.progress,
            "model": model, "generation": gen.tag.fingerprint if gen else None, "slots": slots,
            "params": control.layers.sources(), "last_error": core.last_error,
            "reload": core.current_load.public() if core.current_load else None,
            "rpc": {"port": port, "ggml_rpc_devices": devices}}


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction until EOF, then half-close the other side so the peer sees it."""
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    try:
        while True:
            n = src.recv_into(buf)
            if n == 0:
                break
            dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _FrameIO:
    """Blocking frame reader/writer over one socket, built on the sans-IO decoder."""

    def __init__(self, conn: socket.socket, codes: frozenset[int]) -> None:
        self.conn = conn
        self.decoder = P.FrameDecoder(codes)
        self.frames: deque[P.Frame] = deque()
        self.buf = bytearray(1 << 20)

    def next(self, data_into: StateReceiver | None = None) -> P.Frame | None:
        while not self.frames:
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

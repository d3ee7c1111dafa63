"""The engine's end of a request stream (hydrad/coordinator/reqstream.py says what it is and why).

Opened when the coordinator offers its stream (STREAM, right after WELCOME), with HELLO carrying
this bus connection's identity and the bus token, and used once the coordinator answers READY; it
lives as long as that bus connection. GENERATE and CANCEL that arrive on it are dispatched as the
bus's are, and those requests answer on it (never on the bus: the two paths keep no order between
them). When it ends, the requests in flight are cancelled (the coordinator fails them on its side:
one sent on the stream may not have arrived), and it is opened again an interval later while the bus
stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Callable

from hydrad.common.logs import log_event
from hydrad.common.netaccess import split_endpoint, split_socket_endpoint
from hydrad.wire import messages as M
from hydrad.wire import streamframes as SF

log = logging.getLogger("hydrad.bus")

CONNECT_TIMEOUT_S = 5.0
WILDCARD = frozenset({"*", "0.0.0.0", "::"})  # a coordinator listening everywhere: connect where the bus is
WRITE_LIMIT = 64 << 20  # bytes queued for a coordinator that does not read: beyond, sends fail (the link cancels)


class EngineStream:
    def __init__(self, endpoint: str, identity: bytes, token: str | None, interval: float,
                 dispatch: Callable[[M.Message], None], lost: Callable[[], None],
                 warn: Callable[..., None], bus_endpoint: str = "",
                 refuse: Callable[[list[bytes], str], None] | None = None) -> None:
        self.endpoint = endpoint
        self.bus_endpoint = bus_endpoint
        self.identity = identity
        self.token = token
        self.interval = interval
        self._refuse = refuse  # a GENERATE that does not decode: its request answered at once (the link)
        self._dispatch = dispatch
        self._lost = lost
        self._warn = warn
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bus-request-stream")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def send(self, frames: list[bytes]) -> bool:
        """Write a request message (or a batch of them) on the stream; False when it cannot carry it now
        (down, or a coordinator that does not read it): the caller cancels those requests, as a failed
        bus send's, since a request answers the way its GENERATE came."""
        w = self._writer
        if w is None or w.is_closing() or frames[1] not in SF.ANSWER_KINDS:
            return False
        if w.transport.get_write_buffer_size() > WRITE_LIMIT:
            return False
        w.write(SF.pack(frames))
        return True

    def _target(self) -> tuple[str, int]:
        """Where to connect: the offered host, or for a wildcard one (a stream bound to every address, as
        a bus at ``tcp://*:9500``) the host this engine reaches the bus at."""
        host, port = split_endpoint(self.endpoint)
        if host in WILDCARD:
            try:
                host = split_socket_endpoint(self.bus_endpoint)[0]
            except ValueError:
                host = "127.0.0.1"
        return host, port

    async def _run(self) -> None:
        host, port = self._target()
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 16),
                                                        CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                self._warn("stream-connect", "cannot open the request stream; requests go over the bus",
                           endpoint=self.endpoint, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(self.interval)
                continue
            with contextlib.suppress(OSError):
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(SF.pack([b"HELLO", self.identity, (self.token or "").encode()]))
            try:
                answer = await asyncio.wait_for(SF.read(reader, 64), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, SF.FrameError):
                answer = []
            if answer != [b"READY"]:  # refused (not admitted any more, another token): nothing was sent on it
                writer.close()
                self._warn("stream-refused", "the coordinator refused the request stream; requests go over the bus",
                           endpoint=self.endpoint)
                await asyncio.sleep(self.interval)
                continue
            self._writer = writer
            log_event(log, logging.INFO, "request stream open", endpoint=self.endpoint)
            try:
                await self._read(reader)
            finally:
                self._writer = None
                writer.close()
                self._lost()
            await asyncio.sleep(self.interval)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                frames = await SF.read(reader)
            except (asyncio.IncompleteReadError, OSError):
                self._warn("stream-lost", "request stream closed; requests in flight cancelled", endpoint=self.endpoint)
                return
            except SF.FrameError as exc:
                self._warn("stream-malformed", "malformed request stream message; stream closed", error=str(exc))
                return
            try:
                msg = await M.decode_aside(frames)
            except M.BusDecodeError as exc:
                self._warn("stream-decode", "malformed request stream message dropped", error=exc.reason)
                if self._refuse is not None:
                    self._refuse(frames, exc.reason)
                continue
            if not isinstance(msg, (M.Generate, M.Cancel)):
                self._warn(f"stream-kind-{msg.KIND!r}", "unexpected message on the request stream dropped",
                           kind=msg.KIND.decode())
                continue
            try:
                self._dispatch(msg)
            except Exception as exc:  # a handler bug must not end the stream's reader (as on the bus)
                log_event(log, logging.ERROR, "request stream message handler failed", kind=msg.KIND.decode(),
                          error=repr(exc), exc_info=True)

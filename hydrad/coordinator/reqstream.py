"""The coordinator's end of the request streams (``bus.request_stream``): a plain TCP listener that
admitted engines connect to, carrying a request's path alone (GENERATE and CANCEL out, TOKENS, DONE
and ERROR back) with one thread wake per hop instead of ZeroMQ's three (hydrad/wire/streamframes.py).
Registration, heartbeats, configuration and events stay on the bus; so does every request of an
engine whose stream is not up.

- An engine learns the endpoint from the STREAM offer that follows WELCOME and opens its stream with
  HELLO: ``[b"HELLO", identity, token]``, its bus identity (``<name>~<nonce>``, new for each bus
  connection) and the bus token (empty without one). Only the identity the bus admitted last, of a
  live engine, and the pool's token are accepted, within ``HELLO_TIMEOUT_S``, and answered
  ``[b"READY"]``; anything else is closed at once, and so is a connection beyond ``MAX_PENDING``
  still owing its HELLO (idle sockets cannot pile up). So the stream is as guarded as the bus, and
  one engine has one stream (a newer one replaces it).
- Every message after HELLO goes to the bus's own handler with that identity, so it is decoded,
  checked and dropped exactly as a bus message would be; a malformed or oversized frame closes the
  stream (its length is refused unread).
- A stream that ends fails the requests in flight on its engine (``EngineLost``): a request sent on it
  may not have arrived, and one that has not streamed yet is retried elsewhere, as when an engine goes.
  The engine cancels them on its side, reconnects, and meanwhile its requests go over the bus.
- A send that would queue more than ``WRITE_LIMIT`` bytes for a stream that is not read fails like a
  full bus queue (``EngineUnreachable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from hydrad.common import tokenfile
from hydrad.common.logs import log_event
from hydrad.common.netaccess import split_endpoint
from hydrad.coordinator.records import EngineUnreachable, engine_of
from hydrad.wire import streamframes as SF

log = logging.getLogger("hydra.coordinator.reqstream")

HELLO = b"HELLO"
READY = b"READY"  # the answer to an accepted HELLO: only then does the engine use the stream
HELLO_TIMEOUT_S = 5.0
HELLO_LIMIT = 4096  # an identity and a token: anything longer is not an engine's HELLO
MAX_PENDING = 64  # connections still owing their HELLO; beyond, a new one is closed at once
WRITE_LIMIT = 64 << 20


class RequestStreamDoor:
    def __init__(self, bus: Any, endpoint: str) -> None:
        """``bus``: the CoordinatorBus that owns this door (its engines, token, ``_handle``, ``_warn`` and
        ``fail_requests``); not imported here, since the bus imports this module."""
        self.bus = bus
        self.endpoint = endpoint
        self._links: dict[bytes, asyncio.StreamWriter] = {}  # admitted identity → its stream
        self._corked: dict[asyncio.StreamWriter, list[bytes]] = {}  # what this pass queued, per stream
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._pending = 0
        self.stats = {"opened": 0, "refused": 0, "lost": 0, "sent": 0, "received": 0}

    def bind(self) -> None:
        """Bind now (an OSError names a taken port before the coordinator says it is ready). Port 0 takes a
        free one, which the endpoint (and so the offer) then names. A wildcard host (``*``, as in a bus
        endpoint) listens on every IPv4 address; the offer keeps it, and each engine connects to the host it
        reaches the bus at (hydrad/engine/bus/stream.py)."""
        host, port = split_endpoint(self.endpoint, allow_zero=True)
        bind_host = "0.0.0.0" if host in ("*", "") else host
        s = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((bind_host, port))
            s.listen(128)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self._sock = s
        if port == 0:
            shown = f"[{host}]" if ":" in host else host
            self.endpoint = f"{shown}:{s.getsockname()[1]}"

    async def serve(self) -> None:
        assert self._sock is not None
        self._server = await asyncio.start_server(self._serve, sock=self._sock, limit=1 << 16)
        await self._server.serve_forever()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._links.values()):
            w.close()
        self._links.clear()

    def carries(self, ident: bytes) -> bool:
        """Whether ``ident`` has a stream up now (its next GENERATE goes on it)."""
        w = self._links.get(ident)
        return w is not None and not w.is_closing()

    def public(self) -> dict[str, object]:
        """For /health: the endpoint, the engines whose stream is up, and the counts of streams opened,
        refused and lost and of messages sent and received on them."""
        up = sorted(engine_of(i) or "?" for i, w in self._links.items() if not w.is_closing())
        return {"endpoint": self.endpoint, "engines": up, **self.stats}

    def send(self, ident: bytes, engine: str, frames: list[bytes]) -> bool:
        """Write a message on ``ident``'s stream; False when it has none (the caller uses the bus)."""
        w = self._links.get(ident)
        if w is None or w.is_closing():
            return False
        if w.transport.get_write_buffer_size() > WRITE_LIMIT:  # what one pass corks is flushed before the next
            raise EngineUnreachable(f"engine {engine}: request stream not read")
        queued = self._corked.get(w)
        if queued is None:
            queued = self._corked[w] = []
            asyncio.get_running_loop().call_soon(self._uncork, w)
        queued.append(SF.pack(frames))
        self.stats["sent"] += 1
        return True

    def _uncork(self, w: asyncio.StreamWriter) -> None:
        """Write what this pass of the loop queued for one stream in one go: a burst the gate released
        together (hydrad/coordinator/burst.py) leaves in one send and so reaches the engine in one read,
        as the bus's messages of one pass do; one write each could split it over several reads when the
        coordinator is preempted between them, and the engine would start a step with part of it."""
        queued = self._corked.pop(w, [])
        if queued and not w.is_closing():
            w.write(b"".join(queued))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        with contextlib.suppress(OSError):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ident = None
        try:
            if self._pending >= MAX_PENDING:
                self._refuse(peer, f"more than {MAX_PENDING} connections without HELLO")
                return
            self._pending += 1
            try:
                hello = await asyncio.wait_for(SF.read(reader, HELLO_LIMIT), HELLO_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, SF.FrameError, OSError) as exc:
                self._refuse(peer, f"no valid HELLO ({type(exc).__name__})")
                return
            finally:
                self._pending -= 1
            why = self._check_hello(hello)
            if why is not None:
                self._refuse(peer, why)
                return
            ident = hello[1]
            old = self._links.pop(ident, None)
            if old is not None:
                old.close()
            self._links[ident] = writer
            writer.write(SF.pack([READY]))
            self.stats["opened"] += 1
            name = engine_of(ident)
            log_event(log, logging.INFO, "request stream open", engine=name, peer=str(peer))
            while True:
                try:
                    frames = await SF.read(reader)
                except asyncio.IncompleteReadError:
                    return
                except SF.FrameError as exc:
                    self.bus._warn(f"stream:{name}", "malformed request stream message; stream closed",
                                   engine=name, error=str(exc))
                    return
                if len(frames) < 2 or frames[1] not in SF.ANSWER_KINDS:
                    self.bus._warn(f"stream-kind:{name}", "a message the request stream does not carry; stream closed",
                                   engine=name, kind=repr(frames[1][:16]) if len(frames) > 1 else "?")
                    return
                self.stats["received"] += 1
                self.bus._handle([ident, *frames])
                rec = self.bus.engines.get(name or "")
                if rec is None or not rec.alive or rec.ident != ident:
                    return  # the engine re-registered or went: this stream is not its own any more
        except OSError:
            return
        finally:
            if ident is not None and self._links.get(ident) is writer:
                del self._links[ident]
                self._lost(ident)
            writer.close()

    def _check_hello(self, hello: list[bytes]) -> str | None:
        if len(hello) != 3 or hello[0] != HELLO:
            return "the first message is not HELLO"
        ident, token = hello[1], hello[2]
        name = engine_of(ident)
        rec = self.bus.engines.get(name or "")
        if rec is None or not rec.alive or rec.ident != ident:
            return "not the identity of an admitted engine"
        if self.bus.token is not None and not tokenfile.same(token.decode("utf-8", "replace"), self.bus.token):
            return "wrong bus token"
        return None

    def _refuse(self, peer: object, why: str) -> None:
        self.stats["refused"] += 1
        host = peer[0] if isinstance(peer, tuple) and peer else peer
        self.bus._warn(f"stream-refused:{host}", "request stream refused", peer=str(peer), why=why)  # once per 10 s a host

    def _lost(self, ident: bytes) -> None:
        """The stream ended: what was sent on it may not have arrived; fail its engine's requests."""
        name = engine_of(ident) or "?"
        rec = self.bus.engines.get(name)
        if rec is None or rec.ident != ident or not rec.alive:
            return  # the engine is gone or re-registered: the bus failed its requests already
        self.stats["lost"] += 1
        log_event(log, logging.WARNING, "request stream lost; its engine's requests in flight fail", engine=name)
        self.bus.fail_requests(name, f"engine {name}: request stream lost")


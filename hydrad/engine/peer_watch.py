"""A COMBINE head watches each peer over a connection of its own, so a dead peer is noticed
between requests instead of by llama.cpp in the middle of one.

llama.cpp's ggml-RPC client aborts the whole process when a send or receive to a peer fails,
and freeing a model whose peer is gone sends FREE_BUFFER to it, which aborts too. So a peer's
death must be known before the next compute, and the generation that used it must be set
aside without a free (:meth:`EngineCore.abandon`). The watch holds one ggml-RPC connection per
peer (HELLO, then nothing but a DEVICE_COUNT every ``interval`` seconds, which also keeps the
peer's relay from closing an idle client): a peer process that dies closes it at once, and a
peer host that vanishes fails the keepalive within ``interval`` + ``timeout``.

llama.cpp's stock ``rpc-server`` serves one client at a time, so it never answers this second
connection while the head's own is open: such a peer is reported as unwatched and not watched
(a dead stock peer then aborts the head at its next compute, as it would llama.cpp's own tools).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from typing import Callable

from hydrad.common.logs import log_event
from hydrad.common.netaccess import split_endpoint
from hydrad.engine.rpc.ggml_codec import CAPS_SIZE, DEVICE_COUNT, HEAD, HELLO, SIZE, _recv_exact

log = logging.getLogger("hydrad.peers")


class PeerWatch:
    """One thread per peer endpoint; ``on_lost(endpoint, reason)`` is called once, for the first loss."""

    def __init__(self, endpoints: list[str], on_lost: Callable[[str, str], None], interval: float = 5.0,
                 timeout: float = 5.0) -> None:
        self.endpoints = list(endpoints)
        self.interval = interval
        self.timeout = timeout
        self.unwatched: list[str] = []
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._fired = threading.Lock()
        self._lost: str | None = None
        self._socks: dict[str, socket.socket] = {}
        self._threads = [threading.Thread(target=self._watch, args=(e,), name=f"hydrad-peer-watch-{i}", daemon=True)
                         for i, e in enumerate(self.endpoints)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for s in list(self._socks.values()):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def lost(self) -> str | None:
        return self._lost

    def _watch(self, endpoint: str) -> None:
        try:
            sock = socket.create_connection(split_endpoint(endpoint), timeout=self.timeout)
        except (OSError, ValueError) as exc:
            self._report(endpoint, f"cannot reach it ({exc})")
            return
        self._socks[endpoint] = sock
        try:
            try:
                sock.settimeout(self.timeout)
                sock.sendall(HEAD.pack(HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
                (n,) = SIZE.unpack(_recv_exact(sock, 8))
                _recv_exact(sock, n)
            except socket.timeout:
                self.unwatched.append(endpoint)
                log_event(log, logging.WARNING, "COMBINE peer cannot be watched (it serves one client at a time, "
                          "like llama.cpp's rpc-server); its loss will abort this engine", peer=endpoint)
                return
            except (OSError, ConnectionError) as exc:
                self._report(endpoint, f"handshake failed ({exc or 'closed'})")
                return
            while not self._stop.is_set():
                sock.settimeout(self.interval)
                try:
                    data = sock.recv(1)
                except socket.timeout:
                    data = None
                except OSError as exc:
                    self._report(endpoint, f"connection lost ({exc})")
                    return
                if self._stop.is_set():
                    return
                if data == b"":
                    self._report(endpoint, "connection closed by the peer")
                    return
                if data is not None:  # nothing is owed to us between keepalives
                    self._report(endpoint, "peer sent bytes it owed no one")
                    return
                try:
                    sock.settimeout(self.timeout)
                    sock.sendall(HEAD.pack(DEVICE_COUNT, 0))
                    (n,) = SIZE.unpack(_recv_exact(sock, 8))
                    struct.unpack("<I", _recv_exact(sock, n)[:4])
                except (OSError, ConnectionError, struct.error) as exc:
                    if not self._stop.is_set():
                        self._report(endpoint, f"keepalive failed ({exc or 'timeout'})")
                    return
        finally:
            self._socks.pop(endpoint, None)
            sock.close()

    def _report(self, endpoint: str, reason: str) -> None:
        if self._stop.is_set() or not self._fired.acquire(blocking=False):
            return
        self._lost = f"peer {endpoint}: {reason}"
        log_event(log, logging.ERROR, "COMBINE peer lost", peer=endpoint, reason=reason)
        self._on_lost(endpoint, reason)

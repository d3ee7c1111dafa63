"""A trusted ggml-RPC peer handed to llama.cpp's own RPC server: no relay on its per-token path.

The relay (``ggml_relay``) checks every command a peer sends, at the price of one more hop per
command. On the GPU host that hop cost about 69 µs on each of a decode step's nine commands: a
layer split decoded at 0.84× the speed of the same split against the stock ``rpc-server``. For
peers the operator trusts (``rpc.ggml_direct_from``) this module gives the peer's connection to
a second in-process instance of llama.cpp's server, which then reads and answers the peer
itself, as the stock ``rpc-server`` would: at its speed, with its trust model.

How a connection changes hands inside one process. The instance is *primed*: the line connects
to it, completes HELLO, and the server's thread blocks reading the next command's first byte
from the socket it accepted, descriptor S. The peer's socket is then duplicated onto S
(``dup2``), so S names the peer's socket. The server's blocked read still waits on the old
socket, so the peer's first byte (read by the line beforehand) is written there: the read
returns it, the old socket is released, and every later read and write of the server reaches
the peer. The line hands over only while ``/proc`` shows the server thread blocked in exactly
that read (a one-byte ``recvfrom`` on S), so the order of the bytes is never in doubt. Where
that cannot be read, the line stays off and every peer goes through the relay.

When the peer goes, the server frees what the peer allocated (as for any client) and accepts
its next connection. That connection is the line's own: made, with its HELLO sent, while the
server was busy, into a listening queue that the line emptied first (the listening socket is
reset under the busy server and listens again) and then checked to hold that connection alone.
A stranger's connection to the private port is therefore either dropped or queued behind the
line's own, and dropped at the next round: never accepted. The HELLO answer tells the line that
the peer has gone, and the line is primed again.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import threading
import time
from pathlib import Path
from typing import Any

from hydrad.common.logs import log_event
from hydrad.engine import ggml
from hydrad.engine.rpc.ggml_codec import CAPS_SIZE, HEAD, HELLO, SIZE, _recv_exact

log = logging.getLogger("hydrad.rpc.ggml")

RECVFROM = {"x86_64": 45, "amd64": 45, "aarch64": 207, "arm64": 207}  # the syscall a blocked recv() shows
HELLO_REQUEST = HEAD.pack(HELLO, CAPS_SIZE) + bytes(CAPS_SIZE)
HELLO_ANSWER = 8 + 4 + CAPS_SIZE
BUSY_WAIT_S = 2.0  # how long a trusted peer waits for the line while the previous peer's connection ends


def accept_queue(listener: socket.socket) -> int:
    """Connections waiting to be accepted on a listening socket (``tcpi_unacked`` of its TCP_INFO)."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int.from_bytes(info[24:28], "little")


class DirectLine:
    def __init__(self, cache_dir: Path, n_threads: int, io_timeout_s: float) -> None:
        self.cache_dir = cache_dir
        self.n_threads = n_threads
        self.io_timeout_s = io_timeout_s
        self.error: str | None = None
        self.ready = threading.Event()
        self.stats = {"handed_over": 0, "ended": 0, "declined": 0}
        self._server: ggml.RpcServerThread | None = None
        self._endpoint = ("127.0.0.1", 0)
        self._cond = threading.Condition()
        # all below under _cond: the primed connection, the server's descriptor for it, the queued one,
        # and the peer the server is serving now (set from the moment a hand-over starts)
        self._up: socket.socket | None = None
        self._fd: int | None = None
        self._next: socket.socket | None = None
        self._peer: str | None = None
        self._since = 0.0

    # ----- start and keep primed --------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._boot, name="hydrad-ggml-direct", daemon=True).start()

    def _boot(self) -> None:
        if platform.machine().lower() not in RECVFROM:
            self._fail(f"the direct line cannot tell when the server waits on {platform.machine()}")
            return
        self._server = ggml.RpcServerThread("127.0.0.1", 0, self.cache_dir, self.n_threads)
        self._endpoint = ("127.0.0.1", self._server.port)
        self._server.start()
        deadline = time.monotonic() + 10.0
        up = None
        while up is None:
            try:
                up = self._connect()
            except OSError as exc:
                if time.monotonic() > deadline or (self._server.error is not None):
                    self._fail(self._server.error or f"ggml RPC server of the direct line unreachable: {exc}")
                    return
                time.sleep(0.05)
        try:
            up.settimeout(5)  # answered at once unless a stranger was accepted first
            up.sendall(HELLO_REQUEST)
            self._hello_answer(up)
            up.settimeout(None)
            nxt = self._queue_next()
        except OSError as exc:
            cut = ggml.seal_server(self._endpoint, ("", -1))
            up.close()
            self._fail(f"the direct line's server did not answer its HELLO ({exc}); {cut} other connection(s) cut")
            return
        with self._cond:
            self._prime(up)
            self._next = nxt
        if not self._wait_blocked(2.0):
            self._fail("the server thread was not seen waiting for a command (/proc/self/task/<tid>/syscall); "
                       "the direct line stays off")
            return
        threading.Thread(target=self._watch, name="hydrad-ggml-direct", daemon=True).start()
        log_event(log, logging.INFO, "ggml-RPC direct line ready", endpoint=self._server.endpoint)
        self.ready.set()

    def _connect(self) -> socket.socket:
        s = socket.create_connection(self._endpoint, timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    @staticmethod
    def _hello_answer(s: socket.socket) -> None:
        (n,) = SIZE.unpack(_recv_exact(s, 8))
        if n != HELLO_ANSWER - 8:
            raise OSError(f"unexpected HELLO answer of {n} bytes")
        _recv_exact(s, n)

    def _queue_next(self) -> socket.socket:
        """The line's next connection, its HELLO already on the way, alone in the listening queue: accepted
        when the current client goes. Called while the server serves a connection (not in ``accept``), so
        the listening socket can be reset under it: whatever else waits in the queue is dropped first, and
        the queue is checked to hold only this connection afterwards (else it is done again)."""
        for _ in range(100):
            listener = ggml.listening_socket(self._endpoint)
            if listener is None:
                raise OSError("the direct line's listening socket is gone")
            try:
                listener.shutdown(socket.SHUT_RDWR)  # resets every connection waiting to be accepted
                listener.listen(1)
                s = self._connect()
                s.settimeout(None)
                s.sendall(HELLO_REQUEST)
                if accept_queue(listener) == 1:
                    return s
                s.close()  # someone else got in between: drop them and queue again
            finally:
                listener.close()
        raise OSError("could not keep the direct line's listening queue to itself")

    def _prime(self, up: socket.socket) -> None:
        fd = ggml.accepted_fd(self._endpoint, up.getsockname()[:2])
        if fd is None:
            raise OSError("the server's side of the line's connection was not found")
        self._up, self._fd = up, fd

    def _watch(self) -> None:
        """Wait for the server to accept the queued connection: the peer it served has gone."""
        while True:
            with self._cond:
                nxt = self._next
            assert nxt is not None
            try:
                self._hello_answer(nxt)
                with self._cond:
                    if self._peer is not None:
                        log_event(log, logging.INFO, "ggml-RPC direct peer gone", peer=self._peer,
                                  seconds=round(time.monotonic() - self._since, 1))
                        self.stats["ended"] += 1
                    if self._up is not None:  # (only on close: a primed line is served until it hands over)
                        self._up.close()
                    self._prime(nxt)
                    self._next = self._queue_next()
                    self._peer = None
                    self._cond.notify_all()
            except OSError as exc:
                self._fail(f"the direct line lost its server ({exc}); trusted peers go through the relay")
                return

    def _fail(self, reason: str) -> None:
        with self._cond:
            self.error = reason
            self._cond.notify_all()
        log_event(log, logging.ERROR, "ggml-RPC direct line unavailable", reason=reason)
        self.ready.set()

    # ----- the server thread's state ----------------------------------------------------

    def _blocked(self) -> bool:
        """Whether the server thread waits in a one-byte read of the line's connection (lock held)."""
        tid = self._server.tid if self._server is not None else None
        if tid is None or self._fd is None:
            return False
        try:  # (readable at boot, or the line stayed off; a read that fails later is "not waiting")
            with open(f"/proc/self/task/{tid}/syscall") as f:
                parts = f.read().split()
        except OSError:
            return False
        if len(parts) < 4 or not parts[0].isdigit():
            return False  # "running": between two reads
        return (int(parts[0]) == RECVFROM[platform.machine().lower()] and int(parts[1], 16) == self._fd
                and int(parts[3], 16) == 1)

    def _wait_blocked(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._blocked():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    # ----- hand over ------------------------------------------------------------------

    def take(self, conn: socket.socket, addr: str) -> bool:
        """Hand ``conn`` (its HELLO answered) to the server. False: the line cannot take it now, and the
        caller serves it through the relay. True: the connection is the server's (the caller only closes
        its own descriptor)."""
        if not self.ready.is_set() or self.error is not None:
            return False
        with self._cond:
            deadline = time.monotonic() + BUSY_WAIT_S
            while self._peer is not None and self.error is None and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._peer is not None or self.error is not None or self._up is None or not self._wait_blocked(0.5):
                self.stats["declined"] += 1
                return False
            self._peer, self._since = addr, time.monotonic()
        try:
            conn.settimeout(self.io_timeout_s)
            first = conn.recv(1)
        except OSError:
            first = b""
        with self._cond:
            up, fd = self._up, self._fd
            if not first or up is None or fd is None:  # gone (or silent) before its first command: not handed over
                self._peer = None
                self._cond.notify_all()
                return True
            try:
                if not self._wait_blocked(1.0):  # (it was waiting a moment ago, and nothing else talks to it)
                    raise OSError("the direct line's server stopped waiting for a command")
                conn.setblocking(True)  # the server's reads block (the flag belongs to the socket, shared by S)
                os.dup2(conn.fileno(), fd, inheritable=False)
            except OSError as exc:  # nothing changed hands; the peer's first byte is read, so it is closed
                self._peer = None
                self.error = f"{exc}; trusted peers go through the relay"
                self._cond.notify_all()
                log_event(log, logging.ERROR, "ggml-RPC direct line unavailable", reason=self.error, peer=addr)
                return True
            self._up = self._fd = None
        try:
            up.sendall(first)
            up.settimeout(5)
            rest = up.recv(1)  # the server's read returned: the old socket is released, and this end sees EOF
        except OSError as exc:
            rest = str(exc).encode() or b"timeout"
        finally:
            up.close()
        if rest:
            self._fail(f"the server did not take over the peer's connection ({rest.decode(errors='replace')})")
            return True
        self.stats["handed_over"] += 1
        log_event(log, logging.INFO, "ggml-RPC peer handed to llama.cpp's server", peer=addr)
        return True

    def public(self) -> dict[str, Any]:
        peer = self._peer  # (one read of a reference: no lock, so a view never waits on a hand-over)
        return {"ready": self.ready.is_set() and self.error is None, "error": self.error, "peer": peer,
                "server": f"{self._endpoint[0]}:{self._endpoint[1]}" if self._endpoint[1] else None, **self.stats}


__all__ = ["DirectLine"]

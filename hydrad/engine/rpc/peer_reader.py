"""A ggml-RPC peer's byte stream as the relay reads it: in as large pieces as the socket holds.

A head sends a token's commands back to back (the inputs' SET_TENSORs, the graph, then the
GET_TENSOR it waits on), each as several small ``send`` calls. Reading them command by command costs
two or three ``recv`` calls per command and a thread wake-up for each piece; reading whatever has
arrived into one buffer costs one call for the lot. Before any call that may block, the reader runs
``before_wait``: the relay sends what it has queued for llama.cpp's server there, so nothing a peer
sent is held back while the relay waits for more.
"""

from __future__ import annotations

import socket
from typing import Callable

CAPACITY = 1 << 20  # larger payloads (a layer's weights) are read past the buffer, straight into their own


class PeerReader:
    def __init__(self, conn: socket.socket, before_wait: Callable[[], None], capacity: int = CAPACITY) -> None:
        self.conn = conn
        self.before_wait = before_wait
        self.buf = bytearray(capacity)
        self.view = memoryview(self.buf)
        self.pos = 0  # the next unread byte
        self.end = 0  # one past the last byte received

    def buffered(self) -> int:
        return self.end - self.pos

    def fill(self) -> int:
        """One ``recv`` into the free end of the buffer (blocking, bounded by the socket's own
        timeout, which raises ``BlockingIOError``); returns what arrived, 0 when the peer closed."""
        self.before_wait()
        if self.pos == self.end:
            self.pos = self.end = 0
        elif self.end == len(self.buf):
            n = self.end - self.pos
            self.buf[:n] = self.buf[self.pos:self.end]
            self.pos, self.end = 0, n
        got = self.conn.recv_into(self.view[self.end:])
        self.end += got
        return got

    def need(self, n: int) -> None:
        """Until ``n`` bytes are buffered (``n`` fits the buffer); ``ConnectionError`` if the peer closes."""
        if self.pos + n > len(self.buf):
            k = self.end - self.pos
            self.buf[:k] = self.buf[self.pos:self.end]
            self.pos, self.end = 0, k
        while self.end - self.pos < n:
            if not self.fill():
                raise ConnectionError("connection closed")

    def take(self, n: int) -> bytes | bytearray:
        """Exactly the next ``n`` bytes."""
        if self.end - self.pos >= n:
            out = bytes(self.view[self.pos:self.pos + n])
            self.pos += n
            return out
        if n <= len(self.buf):
            self.need(n)
            out = bytes(self.view[self.pos:self.pos + n])
            self.pos += n
            return out
        big = bytearray(n)  # past the buffer: what is buffered, then the rest straight from the socket
        self.read_into(memoryview(big), n)
        return big

    def read_into(self, into: memoryview, n: int) -> None:
        """Exactly ``n`` bytes into ``into``: the buffered ones first, then from the socket."""
        k = min(n, self.end - self.pos)
        if k:
            into[:k] = self.view[self.pos:self.pos + k]
            self.pos += k
        while k < n:
            self.before_wait()
            got = self.conn.recv_into(into[k:n])
            if not got:
                raise ConnectionError("connection closed")
            k += got

    def read_some(self, into: memoryview, n: int) -> int:
        """Up to ``n`` bytes into ``into``, at least one (0: the peer closed): a large upload's next piece."""
        k = min(n, self.end - self.pos)
        if k:
            into[:k] = self.view[self.pos:self.pos + k]
            self.pos += k
            return k
        self.before_wait()
        return self.conn.recv_into(into[:n])

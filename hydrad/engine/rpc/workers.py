"""The threads that serve the merged port's connections, kept between connections.

A connection used to get a thread of its own. ``Thread.start`` waits until the new thread runs,
and under a flood of short connections that wait was most of the accept loop's time (three
quarters of its samples at 1,000 connections a second on two cores), so connections queued in
the kernel and timed out. Here an accepted connection goes to an idle worker through a queue; a
worker is started only when none is idle, and workers beyond ``keep`` end after ``idle_s``
without work. The number of threads still follows the number of connections being served (a
ggml-RPC session holds its worker for as long as it lasts), so the bounds on connections are the
bounds on threads, as before.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any, Callable

Serve = Callable[[socket.socket, Any], None]


class ConnectionWorkers:
    def __init__(self, serve: Serve, spawn: Callable[[Callable[[], None]], None], *, keep: int = 4,
                 idle_s: float = 2.0) -> None:
        """``serve(conn, addr)`` serves one connection and closes it; ``spawn(fn)`` starts a thread
        running ``fn`` (it raises when it cannot: see :meth:`submit`)."""
        self._serve = serve
        self._spawn = spawn
        self.keep = keep
        self.idle_s = idle_s
        self._queue: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a connection that no submit has claimed
        self._workers = 0
        self._closed = False

    @property
    def workers(self) -> int:
        return self._workers

    def submit(self, conn: socket.socket, addr: Any) -> None:
        """Hand ``conn`` to a worker. Raises what ``spawn`` raised when a new worker was needed and could
        not start; ``conn`` is then still the caller's."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                claimed = True
            else:
                self._workers += 1
                claimed = False
        if not claimed:
            try:
                self._spawn(self._work)
            except BaseException:
                with self._lock:
                    self._workers -= 1
                raise
        self._queue.put((conn, addr))

    def close(self) -> None:
        """Let every idle worker end; busy ones end after their connection."""
        with self._lock:
            self._closed = True
            n = self._workers
        for _ in range(n):
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle and self._workers > self.keep:
                        self._idle -= 1
                        self._workers -= 1
                        return
                continue
            if item is None:
                with self._lock:
                    self._workers -= 1
                return
            self._serve(*item)
            with self._lock:
                if self._closed:
                    self._workers -= 1
                    return
                self._idle += 1

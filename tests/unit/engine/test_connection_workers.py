"""The merged port's connection workers (hydrad/engine/rpc/workers.py), with real threads and sockets:
a worker serves connection after connection, the pool grows with connections served at once and
shrinks when idle, and a worker that cannot start leaves the connection with the caller."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hydrad.engine.rpc.workers import ConnectionWorkers


class _Spawner:
    def __init__(self) -> None:
        self.started = 0
        self.fail = 0

    def __call__(self, fn) -> None:  # type: ignore[no-untyped-def]
        if self.fail:
            self.fail -= 1
            raise RuntimeError("can't start new thread")
        self.started += 1
        threading.Thread(target=fn, daemon=True).start()


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def _wait(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        time.sleep(0.01)


def test_one_worker_serves_connections_one_after_another() -> None:
    served: list[bytes] = []

    def serve(conn: socket.socket, addr: object) -> None:
        served.append(conn.recv(16))
        conn.close()

    spawn = _Spawner()
    w = ConnectionWorkers(serve, spawn, keep=1, idle_s=5)
    try:
        for i in range(20):
            a, b = _pair()
            b.sendall(b"x%d" % i)
            w.submit(a, None)
            _wait(lambda: len(served) == i + 1)
            b.close()
        assert served == [b"x%d" % i for i in range(20)]
        assert spawn.started == 1
    finally:
        w.close()


def test_the_pool_grows_with_connections_served_at_once_and_shrinks_when_idle() -> None:
    release = threading.Event()
    busy = 0
    lock = threading.Lock()

    def serve(conn: socket.socket, addr: object) -> None:
        nonlocal busy
        with lock:
            busy += 1
        release.wait(10)
        conn.close()
        with lock:
            busy -= 1

    spawn = _Spawner()
    w = ConnectionWorkers(serve, spawn, keep=2, idle_s=0.2)
    peers = []
    try:
        for _ in range(6):
            a, b = _pair()
            peers.append(b)
            w.submit(a, None)
        _wait(lambda: busy == 6)  # six at once: six workers
        assert spawn.started == 6 and w.workers == 6
        release.set()
        _wait(lambda: busy == 0)
        _wait(lambda: w.workers == 2)  # idle past idle_s: down to keep
        time.sleep(0.5)
        assert w.workers == 2
    finally:
        release.set()
        w.close()
        for p in peers:
            p.close()


def test_a_worker_that_cannot_start_leaves_the_connection_with_the_caller() -> None:
    served: list[socket.socket] = []

    def serve(conn: socket.socket, addr: object) -> None:
        served.append(conn)
        conn.close()

    spawn = _Spawner()
    spawn.fail = 1
    w = ConnectionWorkers(serve, spawn, keep=1, idle_s=5)
    a, b = _pair()
    try:
        with pytest.raises(RuntimeError):
            w.submit(a, None)
        assert a.fileno() != -1 and served == [] and w.workers == 0  # still open, still the caller's
        w.submit(a, None)  # the next start works
        _wait(lambda: served == [a])
        assert w.workers == 1
    finally:
        w.close()
        b.close()


def test_close_ends_the_idle_workers() -> None:
    spawn = _Spawner()
    done = threading.Event()

    def serve(conn: socket.socket, addr: object) -> None:
        conn.close()
        done.set()

    w = ConnectionWorkers(serve, spawn, keep=4, idle_s=30)
    a, b = _pair()
    w.submit(a, None)
    assert done.wait(5)
    _wait(lambda: w.workers == 1)
    w.close()
    _wait(lambda: w.workers == 0)
    b.close()

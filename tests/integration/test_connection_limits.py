"""Connections that hold a door without using it: idle keep-alive connections are closed at both HTTP
doors, a slow-loris of 2,000 connections leaves an engine serving, and an engine out of file
descriptors keeps serving (its merged port sheds what it cannot accept) and is itself again once they
are back. Real daemons, real sockets on loopback; every connection a test opens is closed at its end."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from hydrad.wire import protocol as P
from hydrad.wire.rpcclient import RpcClient
from tests.conftest import SOLO_PROFILES
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine
from tests.support.wait import eventually

SMOL = {"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_parallel": 1, "n_ctx": 512}


def rpc_port(e: Engine) -> int:
    m = eventually(lambda: re.search(r"rpc=127\.0\.0\.1:(\d+)", e.log()), 20, "the merged port in the log",
                   interval=0.05, context=e.log)
    return int(m.group(1))


def closed_after(s: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closes ``s`` (everything it sends is read), None if it is still open."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def keep_alive_request(s: socket.socket, path: str = "/health") -> None:
    """One keep-alive GET on ``s`` and its whole answer (a JSON body with a Content-Length)."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    s.settimeout(10)
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), head
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += s.recv(65536)


def test_idle_keep_alive_connections_are_closed_at_both_doors(tmp_path: Path, smollm_path: Path,
                                                              start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=SOLO_PROFILES, extra={"http": {"header_timeout_s": 1.0}})
    try:
        c.wait_ready()
        e = start_engine(name="solo", defaults={"n_ctx": 512, "n_threads": 1},
                         extra={"bus": c.engine_bus(), "http": {"header_timeout_s": 1.0}})
        c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
        for door in (e.port, c.port):
            # a connection that goes on using itself is not idle: kept past the timeout
            busy = socket.create_connection(("127.0.0.1", door), timeout=10)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.5:
                keep_alive_request(busy)
                time.sleep(0.4)
            # the same connection, idle after its last answer: closed after about the timeout
            idle_for = closed_after(busy, 10)
            assert idle_for is not None and 0.5 < idle_for < 3.0, (door, idle_for)
            busy.close()
            # a connection that never sends a byte: closed too
            silent = socket.create_connection(("127.0.0.1", door), timeout=10)
            silent_for = closed_after(silent, 10)
            assert silent_for is not None and silent_for < 3.0, (door, silent_for)
            silent.close()
    finally:
        c.stop()


def test_a_slow_loris_leaves_the_engine_serving(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """2,000 connections that each send a request's headers a byte a second (the header timeout is the
    default 10 s, so they all stay for the test) do not keep a normal request waiting."""
    e = start_engine(defaults=SMOL, extra={"rpc": {"port": 0}})
    e.wait_ready()
    port = rpc_port(e)
    loris: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(1.0):
            for s in list(loris):
                try:
                    s.send(b"X")
                except OSError:
                    pass

    dripper = threading.Thread(target=trickle, daemon=True)
    try:
        for _ in range(2000):
            s = socket.create_connection(("127.0.0.1", e.port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            loris.append(s)
        dripper.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        r = httpx.post(f"{e.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=30)
        served_in = time.monotonic() - t0
        assert r.status_code == 200 and served_in < 3.0, (r.status_code, served_in)
        with RpcClient(("127.0.0.1", port), timeout=10) as c:
            assert c.info()["engine"] == "test"
        still = sum(1 for s in loris if s.fileno() >= 0)
        assert still == 2000  # the loris was still there while the request was served
    finally:
        stop.set()
        dripper.join(5) if dripper.is_alive() else None
        for s in loris:
            s.close()
    assert e.proc.poll() is None


def test_out_of_file_descriptors_the_engine_keeps_serving(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """An engine whose every descriptor is taken by idle connections stays up, says why in its log when
    a merged-port connection cannot be accepted, and serves at once on both doors when they go."""
    e = start_engine(defaults=SMOL, extra={"rpc": {"port": 0}, "http": {"header_timeout_s": 60.0}},
                     wrap=["prlimit", "--nofile=256:256", "--"])
    e.wait_ready()
    port = rpc_port(e)
    assert "fd_limit=256" in e.log() and "file descriptor limit is low" in e.log()
    held: list[socket.socket] = []
    try:
        for _ in range(300):  # more than the engine's limit, each idle for a minute
            held.append(socket.create_connection(("127.0.0.1", e.port), timeout=10))
        fds = Path(f"/proc/{e.proc.pid}/fd")
        eventually(lambda: len(list(fds.iterdir())) >= 250, 10, "the engine's descriptors taken", interval=0.1)
        for _ in range(3):
            probe = socket.create_connection(("127.0.0.1", port), timeout=10)
            probe.sendall(P.encode_json(P.Op.INFO, {}))
            held.append(probe)
        eventually(lambda: "out of file descriptors" in e.log(), 5, "the exhaustion logged", context=e.log)
        time.sleep(1.0)
        assert e.proc.poll() is None
    finally:
        for h in held:
            h.close()
    t0 = time.monotonic()
    r = eventually(lambda: httpx.post(f"{e.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=10),
                   5, "a completion once the descriptors are back", ignore=(httpx.TransportError,), interval=0.1)
    assert r.status_code == 200

    def info() -> str:
        with RpcClient(("127.0.0.1", port), timeout=10) as c:
            return str(c.info()["engine"])

    assert eventually(info, 5, "INFO once the descriptors are back", ignore=(OSError,), interval=0.1) == "test"
    assert time.monotonic() - t0 < 5.0


def test_the_daemons_raise_their_descriptor_limit(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """Started with a low soft limit under a high hard one (as from a shell: 1,024 of 524,288), each
    daemon serves under the hard one."""
    low = ["prlimit", "--nofile=512:8192", "--"]
    e = start_engine(wrap=low)
    c = Coordinator(tmp_path, wrap=low)
    try:
        e.notify.wait_for("READY=1")
        c.wait_ready()
        for pid in (e.proc.pid, c.proc.pid):
            limits = Path(f"/proc/{pid}/limits").read_text()
            assert re.search(r"Max open files\s+8192\s+8192", limits), limits
        assert "fd_limit=8192" in e.log() and "fd_limit=8192" in c.log()
    finally:
        c.stop()

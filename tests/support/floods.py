"""Hostile load generators, each run as its own process under limits (nice, prlimit) by the
reliability program, so that the attacker competes with the daemons the way a remote one would
(through the kernel's sockets) and cannot exhaust the machine.

    python -m tests.support.floods control --port P --rate 1000 --seconds 10
    python -m tests.support.floods halfopen --port P --count 10000 --hold 10
    python -m tests.support.floods bus --endpoint tcp://127.0.0.1:P --seconds 10 --peers 8

Each prints one JSON object with what it did and what it met.

* ``control``: connections to an engine's merged port at a fixed rate; each sends either junk bytes or
  a valid INFO frame, reads what comes back for a moment, and closes.
* ``halfopen``: connections to an HTTP door that send the start of a request and never finish it,
  held open for a while (a slowloris); how many the server closed by itself is counted.
* ``bus``: ZeroMQ DEALERs at the coordinator's ROUTER sending as fast as the sockets take them, never
  reading more than they must: the parser fuzzer's bus inputs (valid messages of every kind, their
  mutations, random frames), forged identities (the pool's own engine names), REGISTERs without the
  token, frames over the size limit. What the coordinator answered (REFUSED, REREGISTER) is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import resource
import select
import socket
import sys
import time
from collections import Counter

from hydrad.wire import protocol as P

INFO = P.encode_json(P.Op.INFO, {})


ANSWER_WAIT_S = 0.5  # how long a connection waits for the answer's header before it counts as "short"/"closed"


class _Conn:
    """One control connection of the flood: connect, send, read an answer header, close."""

    __slots__ = ("sock", "what", "payload", "got", "deadline")

    def __init__(self, sock: socket.socket, what: str, payload: bytes, deadline: float) -> None:
        self.sock, self.what, self.payload, self.got, self.deadline = sock, what, payload, b"", deadline


def _outcome(c: _Conn) -> str:
    if len(c.got) >= P.HEADER.size:
        code = c.got[0]
        return "ok" if code == P.Status.OK else "busy" if code == P.Status.BUSY else "error_status"
    return "closed" if not c.got else "short"


def control(port: int, rate: float, seconds: float) -> dict[str, object]:
    """``rate`` connections per second for ``seconds``, opened on schedule by one thread with
    non-blocking sockets and ``selectors``: half send a valid INFO, half junk bytes; each waits up to
    ANSWER_WAIT_S for an answer header. One thread and no locks, because a thread per connection
    spends the generator's CPU on the GIL (128 threads reached about 700-770/s on two busy cores)."""
    import selectors

    counts: Counter[str] = Counter()
    rng = random.Random(0)
    sel = selectors.DefaultSelector()
    live: dict[int, _Conn] = {}
    t0 = time.monotonic()
    last_start = t0
    next_sweep = t0
    n = 0
    total_due = int(rate * seconds)

    def finish(c: _Conn, label: str) -> None:
        counts[label] += 1
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(c.sock)
        live.pop(c.sock.fileno(), None)
        c.sock.close()

    while n < total_due or live:
        now = time.monotonic()
        while n < total_due and t0 + n / rate <= now:
            what = "info" if rng.random() < 0.5 else "junk"
            payload = INFO if what == "info" else os.urandom(rng.randint(1, 64))
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            n += 1
            last_start = now
            err = s.connect_ex(("127.0.0.1", port))
            if err not in (0, errno.EINPROGRESS):
                counts[f"connect_failed:{errno.errorcode.get(err, err)}"] += 1
                s.close()
                continue
            c = _Conn(s, what, payload, now + 2.0)  # the connect itself gets 2 s, as a blocking one did
            live[s.fileno()] = c
            sel.register(s, selectors.EVENT_WRITE, c)
        timeout = min(t0 + n / rate - now, 0.01) if n < total_due else 0.01
        for key, _ in sel.select(max(0.0, timeout)):
            c = key.data
            if c.payload is not None:  # connected (or failed to)
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    finish(c, f"connect_failed:{errno.errorcode.get(err, err)}")
                    continue
                try:
                    c.sock.send(c.payload)  # at most a header and 64 bytes: one send takes it
                except OSError as exc:
                    finish(c, f"{c.what}:{type(exc).__name__}")
                    continue
                c.payload = None
                c.deadline = time.monotonic() + ANSWER_WAIT_S
                sel.modify(c.sock, selectors.EVENT_READ, c)
                continue
            try:
                b = c.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                b = b""
            c.got += b
            if not b or len(c.got) >= P.HEADER.size:
                finish(c, f"{c.what}:{_outcome(c)}")
        now = time.monotonic()
        if now < next_sweep:
            continue
        next_sweep = now + 0.02
        for c in [c for c in live.values() if c.deadline <= now]:
            finish(c, "connect_failed:timeout" if c.payload is not None else f"{c.what}:{_outcome(c)}")
    sel.close()
    took = time.monotonic() - t0
    total = sum(counts.values())
    opened_over = max(1e-9, last_start - t0)  # the last connection's start: the rate the attack held
    return {"kind": "control", "connections": total, "seconds": round(took, 2),
            "rate": round(total / opened_over, 1), "rate_to_last_answer": round(total / took, 1),
            "outcomes": dict(sorted(counts.items()))}


def halfopen(port: int, count: int, hold: float, deadline: float = 10.0) -> dict[str, object]:
    """``count`` connections that each send a request line and one header, then nothing. Those held
    longer than ``deadline`` + 1 s (the server's header timeout, plus slack) should have been closed
    by the server: ``closed_past_deadline`` of ``past_deadline``."""
    socks: list[socket.socket] = []
    opened_at: dict[int, float] = {}
    failed: Counter[str] = Counter()
    t0 = time.monotonic()
    for _ in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: app")
            s.setblocking(False)
            socks.append(s)
            opened_at[s.fileno()] = time.monotonic()
        except OSError as exc:
            failed[type(exc).__name__] += 1
    opened = time.monotonic() - t0
    time.sleep(max(0.0, hold - opened))
    closed = closed_old = 0  # by the server: readable with EOF, or reset
    now = time.monotonic()
    old = {fd for fd, t in opened_at.items() if now - t > deadline + 1}
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    for fd, _ in poller.poll(0):
        try:
            gone = by_fd[fd].recv(4096) == b""
        except OSError:
            gone = True
        if gone:
            closed += 1
            closed_old += fd in old
    for s in socks:
        s.close()
    return {"kind": "halfopen", "asked": count, "opened": len(socks), "open_seconds": round(opened, 2),
            "held_seconds": round(time.monotonic() - t0, 2), "closed_by_server": closed,
            "past_deadline": len(old), "closed_past_deadline": closed_old,
            "connect_failed": dict(failed), "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}


def bus(endpoint: str, seconds: float, peers: int = 8, names: tuple[str, ...] = ("rel-a", "rel-b"),
        seed: int = 1) -> dict[str, object]:
    import zmq

    from tests.support.scripts import load_script

    fz = load_script("fuzz_parsers", "fuzz_parsers")
    target = fz.TARGETS["bus"]
    corpus = list(target.seeds)
    rng = random.Random(seed)
    ctx = zmq.Context()
    socks = []
    for i in range(peers):
        s = ctx.socket(zmq.DEALER)
        # half the peers take the pool's engine names as identities (a forged engine), the rest their own
        ident = f"{names[i % len(names)]}~{rng.getrandbits(64):016x}" if i % 2 == 0 else f"flood-{i}"
        s.setsockopt(zmq.IDENTITY, ident.encode())
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 1000)
        s.setsockopt(zmq.RCVHWM, 1000)
        s.connect(endpoint)
        socks.append(s)
    counts: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    big = b"x" * (8 << 20)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for s in socks:
            x = rng.random()
            if x < 0.001:
                frames, what = [b"hydra-bus/2", b"TOKENS", big], "oversized"
            elif x < 0.05:
                frames, what = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
                                for _ in range(rng.randint(1, 5))], "random"
            else:
                frames, what = fz.generate(rng, target, corpus).split(fz.SEP), "fuzzed"
            try:
                s.send_multipart(frames, flags=zmq.NOBLOCK)
                counts[f"sent:{what}"] += 1
            except zmq.Again:
                counts["dropped (high-water mark)"] += 1
            while s.poll(0):
                reply = s.recv_multipart()
                answers[reply[1].decode("ascii", "replace")[:16] if len(reply) > 1 else "?"] += 1
    elapsed = time.monotonic() - t0
    for s in socks:
        s.close(0)
    ctx.term()
    sent = sum(v for k, v in counts.items() if k.startswith("sent"))
    return {"kind": "bus", "peers": peers, "seconds": round(elapsed, 2), "messages": sent,
            "rate": round(sent / elapsed, 1), "outcomes": dict(counts), "answers": dict(answers)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    c = sub.add_parser("control")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--rate", type=float, default=1000)
    c.add_argument("--seconds", type=float, default=10)
    h = sub.add_parser("halfopen")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--count", type=int, default=10000)
    h.add_argument("--hold", type=float, default=10)
    b = sub.add_parser("bus")
    b.add_argument("--endpoint", required=True)
    b.add_argument("--seconds", type=float, default=10)
    b.add_argument("--peers", type=int, default=8)
    a = ap.parse_args(argv)
    if a.kind == "bus":
        res = bus(a.endpoint, a.seconds, a.peers)
    else:
        res = control(a.port, a.rate, a.seconds) if a.kind == "control" else halfopen(a.port, a.count, a.hold)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

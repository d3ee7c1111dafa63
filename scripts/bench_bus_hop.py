#!/usr/bin/env python3
"""What one hop of the bus costs, against a plain socket: ping-pong between two processes on loopback.

The coordinator's front door sends GENERATE over the bus and gets the first token back over it: two
hops on every request's path that a request straight to an engine does not take. Each hop here is
the bus's own pattern, a ``zmq.asyncio`` ROUTER in one uvloop process and a DEALER in another
(``tcp://`` as the daemons use it, and ``ipc://``), against an asyncio TCP stream between the same
two processes. ZeroMQ moves every message through an I/O thread on each side, so a hop wakes three
threads where a plain socket wakes one; on a virtual machine each wake of an idle CPU is costly.

Figures: the median and p90 of the round trip over ``--messages`` 64-byte messages after a warm-up,
one way = half of it, and each transport's one way ÷ plain TCP's. Runs alternate, ``--runs`` each.
Back to back, both processes stay hot; a request's hops find them idle (the coordinator waits while
the engine computes), which ``--idle-ms`` stands for: the near side sleeps that long before each
message, so every hop wakes sleeping threads on idle CPUs, as a request's do.

    .venv/bin/python scripts/bench_bus_hop.py --runs 5
    .venv/bin/python scripts/bench_bus_hop.py --runs 5 --messages 500 --idle-ms 5
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import uvloop
import zmq
import zmq.asyncio

PAYLOAD = b"x" * 64
WARM = 50


def _echo(kind: str, endpoint: str, messages: int) -> None:
    """The far side: an engine's DEALER (or a TCP client) that answers each message at once."""

    async def main() -> None:
        if kind == "tcp":
            host, port = endpoint.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            for _ in range(messages + WARM):
                writer.write(await reader.readexactly(len(PAYLOAD)))
            writer.close()
            return
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        await sock.send_multipart([b"hello"])
        for _ in range(messages + WARM):
            frames = await sock.recv_multipart()
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        await asyncio.sleep(0.1)
        sock.close()
        ctx.term()

    uvloop.run(main())


async def _round_trips(kind: str, messages: int, tmp: Path, idle_s: float) -> list[int]:
    """Round trips in ns, the near side being the coordinator's ROUTER (or a TCP server)."""
    out: list[int] = []
    if kind == "tcp":
        peer: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        server = await asyncio.start_server(lambda r, w: peer.put_nowait((r, w)), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proc = mp.Process(target=_echo, args=(kind, f"127.0.0.1:{port}", messages))
        proc.start()
        reader, writer = await peer.get()
        for _ in range(messages + WARM):
            if idle_s:
                time.sleep(idle_s)  # the whole process idle, not only this task
            t0 = time.perf_counter_ns()
            writer.write(PAYLOAD)
            await reader.readexactly(len(PAYLOAD))
            out.append(time.perf_counter_ns() - t0)
        writer.close()
        server.close()
    else:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if kind == "zmq-ipc":
            endpoint = f"ipc://{tmp / 'bus.sock'}"
            sock.bind(endpoint)
        else:
            endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
        proc = mp.Process(target=_echo, args=(kind, endpoint, messages))
        proc.start()
        ident, _ = await sock.recv_multipart()
        for _ in range(messages + WARM):
            if idle_s:
                time.sleep(idle_s)
            t0 = time.perf_counter_ns()
            sock.send_multipart([ident, PAYLOAD], flags=zmq.NOBLOCK)
            await sock.recv_multipart()
            out.append(time.perf_counter_ns() - t0)
        sock.close()
        ctx.term()
    proc.join(10)
    return out[WARM:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each transport, alternating (default 5)")
    ap.add_argument("--messages", type=int, default=2000, help="round trips timed per run (default 2000)")
    ap.add_argument("--idle-ms", type=float, default=0.0,
                    help="the near side sleeps this long before each message (default 0: back to back)")
    args = ap.parse_args()
    kinds = ("tcp", "zmq-tcp", "zmq-ipc")
    medians: dict[str, list[float]] = {k: [] for k in kinds}
    p90s: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="hydra-bench-bus-") as tmp:
        for run in range(args.runs):
            for kind in kinds if run % 2 == 0 else reversed(kinds):
                rtt = sorted(uvloop.run(_round_trips(kind, args.messages, Path(tmp), args.idle_ms / 1000)))
                medians[kind].append(statistics.median(rtt) / 1000)
                p90s[kind].append(rtt[int(len(rtt) * 0.9)] / 1000)
    base = statistics.median(medians["tcp"]) / 2
    print("| transport | round trip median µs | p90 µs | one way µs | one way ÷ plain TCP |")
    print("|---|---:|---:|---:|---:|")
    for kind in kinds:
        m = statistics.median(medians[kind])
        print(f"| {kind} | {m:.0f} | {statistics.median(p90s[kind]):.0f} | {m / 2:.0f} | {m / 2 / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

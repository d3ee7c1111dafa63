"""A userspace TCP relay that adds one link's latency: every byte read on one side is written on the
other ``delay`` ms (± ``jitter`` ms, uniform) later, in order, both ways. What the multi-host test bed
(``tests.support.netpartition.Bed``) runs for a link where the kernel has no ``sch_netem``.

It cannot drop packets (TCP below it repairs any loss; the bed says loss needs netem), and jitter never
reorders bytes: a piece is due no earlier than the one before it, as on one TCP stream.

Run inside a node's network namespace: ``python -m tests.support.tcprelay LISTEN_PORT TARGET_HOST
TARGET_PORT --delay-ms 20 --jitter-ms 5``; it listens on 127.0.0.1 and prints ``ready`` once it does.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, jitter: float,
                rng: random.Random) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    task = asyncio.create_task(deliver())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            due = max(last, time.monotonic() + max(0.0, delay + rng.uniform(-jitter, jitter)))
            last = due
            await queue.put((due, data))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
    finally:
        writer.close()


async def _serve(port: int, host: str, target_port: int, delay: float, jitter: float, seed: int) -> None:
    rng = random.Random(seed)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(host, target_port), 10)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_w, delay, jitter, rng), _pump(up_r, writer, delay, jitter, rng),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("listen_port", type=int)
    ap.add_argument("target_host")
    ap.add_argument("target_port", type=int)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        asyncio.run(_serve(a.listen_port, a.target_host, a.target_port, a.delay_ms / 1000, a.jitter_ms / 1000, a.seed))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

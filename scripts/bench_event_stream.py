#!/usr/bin/env python3
"""What a streamed answer's response object costs: Starlette's ``StreamingResponse`` against hydrad's
``EventStream``, the same two-event stream answered in-process (no socket, no client) on uvloop,
alternating blocks of answers, medians of each block.

``StreamingResponse`` under an ASGI 2.3 server (uvicorn) runs each answer in an anyio task group
beside a disconnect listener and starts its writer a loop turn later; ``EventStream`` writes from the
handler's own task with a plain watcher beside it. The figure is time per whole answer; most of the
difference lies before the first byte.

    .venv/bin/python scripts/bench_event_stream.py --answers 3000 --blocks 6
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from starlette.responses import StreamingResponse  # noqa: E402

from hydrad.common.eventstream import EventStream  # noqa: E402
from hydrad.common.serving import run_loop  # noqa: E402

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


async def _events() -> AsyncIterator[bytes]:
    yield b'data: {"choices":[{"text":"x"}]}\n\n'
    yield b"data: [DONE]\n\n"


async def _block(make: Any, answers: int) -> float:
    """Median microseconds per answer over ``answers`` answers."""
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()  # a client that stays: the disconnect listener waits for ever
        return {"type": "http.disconnect"}

    async def send(_: Any) -> None:
        return None

    times = []
    for _ in range(answers):
        response = make()
        t0 = time.perf_counter()
        await response(SCOPE, receive, send)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def _main(answers: int, blocks: int) -> int:
    kinds = {
        "StreamingResponse": lambda: StreamingResponse(_events(), media_type="text/event-stream"),
        "EventStream": lambda: EventStream(_events()),
    }
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for b in range(blocks):
        order = list(kinds) if b % 2 == 0 else list(reversed(kinds))
        for name in order:
            got[name].append(await _block(kinds[name], answers))
    for name, xs in got.items():
        print(f"{name}: median {statistics.median(xs):.1f} us per answer (blocks: {', '.join(f'{x:.1f}' for x in xs)})")
    ratio = statistics.median(got["StreamingResponse"]) / statistics.median(got["EventStream"])
    print(f"StreamingResponse / EventStream: {ratio:.1f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", type=int, default=3000, help="answers per block (default 3000)")
    ap.add_argument("--blocks", type=int, default=6, help="alternating blocks per kind (default 6)")
    args = ap.parse_args()
    return run_loop(_main(args.answers, args.blocks))


if __name__ == "__main__":
    raise SystemExit(main())

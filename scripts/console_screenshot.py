#!/usr/bin/env python3
"""Render the console's main screen to an SVG: the picture in the README (docs/console-main.svg).

The pool is the recording the snapshot tests replay (``tests/data/console-stream.json``: three GPU
engines, traffic, a switch from profile dense to gemma), stopped 21.5 s in, mid-switch, so the
picture is the same on every run and on every machine. Times print in UTC.

    scripts/console_screenshot.py                 # writes docs/console-main.svg
    scripts/console_screenshot.py --at 30 --size 80x24 --out pool.svg
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def render(at: float, size: tuple[int, int], out: Path) -> None:
    from tests.support.console_replay import make_app, replay, started

    app, clock = make_app()
    async with app.run_test(size=size) as pilot:
        await started(app, pilot)
        await replay(app, clock, pilot, at)
        await pilot.pause(0.3)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--at", type=float, default=21.5, help="seconds into the recording (default 21.5: mid-switch)")
    ap.add_argument("--size", default="132x36", help="terminal COLUMNSxROWS (default 132x36)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "console-main.svg", help="SVG file to write")
    args = ap.parse_args(argv)
    try:
        cols, rows = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        ap.error("--size: COLUMNSxROWS, like 132x36")
    os.environ["TZ"] = "UTC"
    time.tzset()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(render(args.at, (cols, rows), args.out.resolve()))
    print(f"{args.out}: {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

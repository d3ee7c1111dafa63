"""hydrad.common.loopwatch: a real event loop held by a blocking callback is noticed, timed and placed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from hydrad.common.loopwatch import LoopWatch, where


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # blocking on purpose: what a callback that forgets to await does


def test_a_held_loop_is_logged_with_how_long_and_where(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.loopwatch")

    async def main() -> LoopWatch:
        watch = LoopWatch(asyncio.get_running_loop(), 0.02, log)
        watch.start()
        await asyncio.sleep(0.1)
        _hold_the_loop(0.15)
        await asyncio.sleep(0.1)
        watch.stop()
        return watch

    with caplog.at_level(logging.INFO, logger="test.loopwatch"):
        watch = asyncio.run(main())
    long = [(s, at) for s, at in watch.held if s >= 0.1]
    assert long, watch.held
    held, at = long[0]
    assert held < 1.0
    assert "_hold_the_loop" in at and "test_loopwatch.py" in at
    record = next(r for r in caplog.records if r.getMessage() == "event loop held")
    assert record.fields["ms"] >= 100 and "_hold_the_loop" in record.fields["where"]  # type: ignore[attr-defined]


def test_an_idle_loop_is_not_logged_and_the_watch_ends_with_its_loop() -> None:
    log = logging.getLogger("test.loopwatch")

    async def main() -> LoopWatch:
        watch = LoopWatch(asyncio.get_running_loop(), 0.3, log)  # generous: a shared machine's scheduling
        watch.start()
        await asyncio.sleep(0.8)
        return watch

    watch = asyncio.run(main())  # the loop closes without stop(): the watch thread must end by itself
    assert list(watch.held) == []
    assert watch._thread is not None
    watch._thread.join(2)
    assert not watch._thread.is_alive()


def test_where_names_the_innermost_frames_innermost_first() -> None:
    import sys

    def inner() -> str:
        return where(sys._current_frames()[threading.get_ident()], depth=2)

    got = inner()
    assert got.startswith("test_loopwatch.py:") and " inner" in got.split(" < ")[0]
    assert where(None) == "-"

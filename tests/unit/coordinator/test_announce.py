"""When the front door logs and publishes a routing decision (FrontDoor._announce_soon): once, off the
request's path. A request on its way is announced in the pass after its first event is in, or when the
bound runs out before that; a request whose GENERATE never left is announced in the next pass.

The real method on a real event loop; the object it runs on records the announcements instead of
building a whole front door (routing, a bus, an engine), which this scheduling does not touch."""

from __future__ import annotations

import asyncio
from typing import Any

from hydrad.coordinator.frontdoor import ANNOUNCE_WITHIN_S, FrontDoor


class Recorder:
    _announce_soon = FrontDoor._announce_soon

    def __init__(self) -> None:
        self.announced: list[tuple[str, int]] = []

    def _announce(self, rr: Any, decision: Any, rid: str, attempt: int) -> None:
        self.announced.append((rid, attempt))


def test_a_request_on_its_way_is_announced_once_after_its_first_event() -> None:
    async def main() -> list[list[tuple[str, int]]]:
        fd = Recorder()
        seen = []
        first_event_in = fd._announce_soon(None, None, "r1", 1, 5.0)
        await asyncio.sleep(0)
        seen.append(list(fd.announced))  # on its way, no event yet: nothing
        first_event_in()
        seen.append(list(fd.announced))  # the pass that the event woke writes the answer first
        await asyncio.sleep(0)
        seen.append(list(fd.announced))
        first_event_in()  # the stream's finally may call it again: still once
        await asyncio.sleep(0.01)
        seen.append(list(fd.announced))
        return seen

    assert asyncio.run(main()) == [[], [], [("r1", 1)], [("r1", 1)]]


def test_a_request_with_no_first_event_is_announced_within_the_bound() -> None:
    async def main() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        fd = Recorder()
        later = fd._announce_soon(None, None, "r2", 2, 0.05)
        await asyncio.sleep(0.02)
        before = list(fd.announced)
        await asyncio.sleep(0.1)
        later()  # the first event comes after the bound: no second announcement
        await asyncio.sleep(0)
        return before, fd.announced

    before, after = asyncio.run(main())
    assert before == [] and after == [("r2", 2)]
    assert 0 < ANNOUNCE_WITHIN_S <= 0.1  # a console sees a long prefill's decision within a tenth of a second


def test_a_request_that_never_left_is_announced_in_the_next_pass() -> None:
    async def main() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        fd = Recorder()
        fd._announce_soon(None, None, "r3", 1)
        now = list(fd.announced)
        await asyncio.sleep(0)
        return now, fd.announced

    assert asyncio.run(main()) == ([], [("r3", 1)])

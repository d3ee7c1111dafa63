"""``eventually``: the one way tests wait for something to become true.

A test that waits polls a probe until it holds, and on timeout fails with a message that names
what it waited for and the last value the probe returned (or the last exception it was allowed to
raise), so a red run says what was seen instead of just "timed out". ``eventually_async`` is the
same for a test that runs in an event loop (it awaits ``sleep`` between probes)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, NoReturn, TypeVar

T = TypeVar("T")

_MISSING: Any = object()


def _show(value: Any, limit: int = 3000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class _Wait:
    """One wait: probes, remembers the last value seen, and says when it is over."""

    def __init__(self, probe: Callable[[], Any], timeout: float, what: str, until: Callable[[Any], Any] | None,
                 ignore: tuple[type[BaseException], ...], context: Callable[[], str] | None) -> None:
        self.probe, self.timeout, self.what, self.until = probe, timeout, what, until
        self.ignore, self.context = ignore, context
        self.deadline = time.monotonic() + timeout
        self.last: Any = _MISSING

    def holds(self) -> bool:
        """Probe once; False, or AssertionError when this was the last probe the deadline allows."""
        expired = time.monotonic() >= self.deadline
        try:
            self.last = self.probe()
        except self.ignore as exc:
            self.last = exc
        else:
            if self.until(self.last) if self.until is not None else self.last:
                return True
        if expired:
            self.fail()
        return False

    def pause(self, interval: float) -> float:
        return max(0.0, min(interval, self.deadline - time.monotonic()))

    def fail(self) -> NoReturn:
        seen = "nothing" if self.last is _MISSING else _show(self.last)
        extra = f"\n{self.context()}" if self.context is not None else ""
        raise AssertionError(f"timed out after {self.timeout:g}s waiting for {self.what}; last seen: {seen}{extra}")


def eventually(probe: Callable[[], T], timeout: float, what: str, *,
               until: Callable[[T], Any] | None = None, interval: float = 0.02,
               ignore: tuple[type[BaseException], ...] = (),
               context: Callable[[], str] | None = None) -> T:
    """Call ``probe`` every ``interval`` seconds until it holds, and return its value.

    The probe holds when its value is truthy, or, with ``until``, when ``until(value)`` is truthy.
    Exceptions of the types in ``ignore`` count as "not yet" (e.g. ``httpx.TransportError`` while
    a daemon is not listening); any other exception, AssertionError included, ends the wait at
    once, so a probe can fail fast when the process it waits on has died. On timeout it raises
    AssertionError naming ``what``, the last value seen and, if given, ``context()`` (a log tail).
    The probe is always called at least once, and once more at the deadline."""
    w = _Wait(probe, timeout, what, until, ignore, context)
    while not w.holds():
        time.sleep(w.pause(interval))
    return w.last  # type: ignore[no-any-return]


async def eventually_async(probe: Callable[[], T], timeout: float, what: str, *,
                           until: Callable[[T], Any] | None = None, interval: float = 0.02,
                           ignore: tuple[type[BaseException], ...] = (),
                           context: Callable[[], str] | None = None,
                           sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> T:
    """:func:`eventually` inside an event loop: awaits ``sleep`` (e.g. a Textual pilot's pause)
    between probes, so the loop runs what the test waits for."""
    w = _Wait(probe, timeout, what, until, ignore, context)
    while not w.holds():
        await sleep(w.pause(interval))
    return w.last  # type: ignore[no-any-return]

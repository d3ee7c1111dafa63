"""``eventually``: the one way tests wait for something to become true.

A test that waits polls a probe until it holds, and on timeout fails with a message that names
what it waited for and the last value the probe returned (or the last exception it was allowed to
raise), so a red run says what was seen instead of just "timed out"."""
from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_MISSING: Any = object()


def _show(value: Any, limit: int = 3000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


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
    deadline = time.monotonic() + timeout
    last: Any = _MISSING
    while True:
        expired = time.monotonic() >= deadline
        try:
            value = probe()
        except ignore as exc:
            last = exc
        else:
            last = value
            if (until(value) if until is not None else value):
                return value
        if expired:
            break
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
    seen = "nothing" if last is _MISSING else _show(last)
    extra = f"\n{context()}" if context is not None else ""
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last seen: {seen}{extra}")

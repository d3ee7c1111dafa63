"""A request's events as the front door reads them from the bus: TOKENS, PROGRESS, DONE and ERROR
decoded into the one event stream (:mod:`hydrad.wire.events`) that the renderers read on both
doors, with the front door's own endings made into events too: an engine lost, or silent past
``token_timeout_s``, is a :class:`~hydrad.wire.events.Failed` like any other.

Failure rules after the first token (see ``frontdoor``): a stream ends in its dialect's error
shape; a non-streaming request raises :class:`Lost` when its engine failed (the front door may
retry it: nothing reached the client yet), else the error (502, 504 or the engine's own).
Whichever way an answer ends, a request still running on its engine is cancelled there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hydrad.common.logs import log_event
from hydrad.coordinator.records import EngineLost, RequestStream
from hydrad.wire import events
from hydrad.wire import messages as M

log = logging.getLogger("hydra.coordinator")


class Lost(Exception):
    """A non-streaming request's engine failed part-way; nothing reached the client yet."""


@dataclass(frozen=True)
class Turn:
    """What a finished turn needs for affinity and the session store."""

    engine: str
    session: str | None  # inside the request's cache namespace (hydrad.common.tenants.scoped)
    messages: list[dict[str, str]] | None
    ns: str = ""  # the request's cache namespace
    quota: int = 0  # its tenant's Store quota in bytes (0: none)


class BusEvents:
    """One GENERATE's events (:class:`hydrad.wire.answering.EventSource`). ``retry_lost``: an
    engine failure raises :class:`Lost` instead of becoming the answer (a whole answer, of which
    nothing went out yet)."""

    def __init__(self, bus: Any, stream: RequestStream, token_timeout_s: float, engine: str, rid: str,
                 retry_lost: bool) -> None:
        self.bus, self.stream, self.timeout, self.engine, self.rid = bus, stream, token_timeout_s, engine, rid
        self.retry_lost = retry_lost

    def event(self, msg: Any) -> events.Event:
        """``msg`` (what the stream held, None after the timeout) as an event."""
        if isinstance(msg, M.Tokens):
            return msg.event()
        if isinstance(msg, (M.Done, M.Progress)):
            return msg.event()
        if isinstance(msg, M.Error):
            if msg.engine_failed and self.retry_lost:
                raise Lost(f"engine {self.engine} failed during the request: {msg.message}")
            return msg.event()
        if isinstance(msg, EngineLost):
            # lost after it started generating: the request itself may be what killed it, so it is
            # not tried on a second engine
            log_event(log, logging.WARNING, "engine failed mid-request", req=self.rid, engine=self.engine,
                      error=msg.reason)
            when = "during the request" if self.retry_lost else "mid-stream"
            return events.Failed(f"engine {self.engine} failed {when} ({msg.reason})", True, 502, "engine_failed")
        log_event(log, logging.WARNING, "engine went silent mid-request", req=self.rid, engine=self.engine)
        return events.Failed(f"engine {self.engine} sent nothing for {self.timeout:g} s", False, 504, "timeout")

    async def next(self) -> events.Event:
        return self.event(await self.stream.next(self.timeout))

    def ready(self) -> bool:
        return self.stream.ready()

    def extra(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        if not self.stream.finished:
            self.bus.cancel(self.stream)


# 503 codes by which an engine says "not now" (no model yet, reloading, full, stopping): the same
# request may well succeed elsewhere. Any other error is the request's and is passed on as is.
RETRY_CODES = frozenset({"no_model", "reloading", "queue_full", "shutting_down", "context_full",
                         "model_not_loaded", "busy"})


def retry_reason(engine: str, ev: Any, waited: float) -> str | None:
    """Why the first event of a request calls for another engine, or None (hydrad.coordinator.frontdoor's
    module doc says which failures those are)."""
    if ev is None:
        return f"engine {engine} sent nothing within {waited:g} s"
    if isinstance(ev, EngineLost):
        return f"engine {engine} failed before the first token ({ev.reason})"
    if isinstance(ev, M.Error) and (ev.engine_failed or (ev.status == 503 and ev.code in RETRY_CODES)):
        return f"engine {engine} answered {ev.status} {ev.code}: {ev.message}"
    return None


STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Started:
    """A request on its way: the engine generating it, the model served, its bus stream, its first
    event, the answer's headers and what the finished turn records."""

    engine: str
    served: str | None
    stream: Any
    first: Any
    headers: dict[str, str]
    turn: Turn

"""A request's answer driven from its events, the same way on both doors: a renderer
(:mod:`hydrad.wire.render`) per dialect turns the one event stream (:mod:`hydrad.wire.events`)
into a stream or a whole body; what differs between the doors is only where the events come
from (an :class:`EventSource`): the engine thread's queue, or the bus.

A stream writes the events already waiting in one write: each write is a send on the client's
socket, and when the reader has fallen behind, one send per token is what keeps it behind. A
stream that fails after its head went out ends in the dialect's own error shape; so does a bug
in here (the headers are out: the client must still see an end). Whichever way an answer ends,
the request still running where it runs is cancelled (:meth:`EventSource.close`).
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable, Protocol

from hydrad.common.logs import log_event
from hydrad.wire.events import Done, Event, Failed, Progress, Token
from hydrad.wire.openai import ApiError, overflow_details
from hydrad.wire.render.base import Renderer

log = logging.getLogger("hydrad.answer")


class EventSource(Protocol):
    """Where a request's events come from, after its first (which the door waited for itself)."""

    async def next(self) -> Event:
        """The next event; a source that gives up waiting says so with a :class:`Failed`."""

    def ready(self) -> bool:
        """Whether :meth:`next` would return at once."""

    def extra(self) -> dict[str, Any]:
        """Timings the door measured on the way (added to llama-server's ``timings``)."""

    def close(self) -> None:
        """The answer is over: cancel the request where it runs, unless it ended."""


def refused(ev: Failed) -> ApiError:
    """A request's failure, before any answer went out, as the error its client gets."""
    return ApiError(ev.status, ev.message, ev.code, ev.param,
                    headers={"Retry-After": "1"} if ev.status == 503 else None,
                    details=overflow_details(ev.n_prompt_tokens, ev.n_ctx))


async def stream(source: EventSource, r: Renderer, first: Event,
                 on_end: Callable[[str, Done], None] | None = None) -> AsyncIterator[bytes]:
    """The answer as server-sent events; ``on_end`` gets the text and the end of a finished one."""
    head = r.head()
    out: list[bytes] = [head] if head else []
    texts: list[str] | None = [] if on_end is not None else None
    ev = first
    try:
        while True:
            if isinstance(ev, Token):
                out.append(r.piece(ev))
                if texts is not None:
                    texts.append(ev.text)
            elif isinstance(ev, Progress):
                out.append(r.progress(ev))
            elif isinstance(ev, Done):
                out.append(r.end(ev, source.extra()))
                yield b"".join(out)
                if on_end is not None:
                    on_end("".join(texts or ()), ev)
                return
            elif isinstance(ev, Failed):
                out.append(r.broken(ApiError(ev.status, ev.message, ev.code)))
                yield b"".join(out)
                return
            if out and not source.ready():
                yield b"".join(out)
                out = []
            ev = await source.next()
    except Exception as exc:  # headers are out: a bug here must still end the stream properly
        log_event(log, logging.ERROR, "stream failed", error=repr(exc), exc_info=True)
        yield b"".join((*out, r.broken(ApiError(500, "internal error (see the log)", "internal_error"))))
    finally:
        source.close()


async def whole(source: EventSource, r: Renderer, first: Event,
                on_end: Callable[[str, Done], None] | None = None) -> tuple[dict[str, Any], Done]:
    """The whole answer's body and its end; a failure is raised as the ApiError it stands for."""
    pieces: list[Token] = []
    ev = first
    try:
        while True:
            if isinstance(ev, Token):
                pieces.append(ev)
            elif isinstance(ev, Done):
                body = r.whole(pieces, ev, source.extra())
                if on_end is not None:
                    on_end("".join(t.text for t in pieces), ev)
                return body, ev
            elif isinstance(ev, Failed):
                raise refused(ev)
            ev = await source.next()
    finally:
        source.close()

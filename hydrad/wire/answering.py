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

import asyncio
import logging
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

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


def merged_usage(dones: list[Done]) -> dict[str, Any]:
    """OpenAI's usage of a request for several choices: the prompt once, every choice's tokens."""
    first = dones[0].usage
    made = sum(d.usage.completion_tokens for d in dones)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": made, "total_tokens": first.prompt_tokens + made,
            "prompt_tokens_details": {"cached_tokens": first.cached_tokens}}


async def _pump(i: int, source: EventSource, first: Event, out: "asyncio.Queue[tuple[int, Event]]") -> None:
    ev = first
    while True:
        out.put_nowait((i, ev))
        if isinstance(ev, (Done, Failed)):
            return
        ev = await source.next()


async def stream_choices(sources: list[EventSource], rs: list[Any], firsts: Sequence[Event]) -> AsyncIterator[bytes]:
    """A request for ``n`` choices (OpenAI's ``n``) as one stream: each choice's events through its
    own renderer (the same id, its own ``index``), interleaved as they come; after every choice's
    last chunk, the merged usage (when asked) and ``[DONE]``. A choice that fails ends the stream
    with the error, and the other choices are cancelled."""
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(i, s, f, queue)) for i, (s, f) in enumerate(zip(sources, firsts))]
    out: list[bytes] = [r.head() for r in rs]
    dones: dict[int, Done] = {}
    try:
        while len(dones) < len(rs):
            i, ev = await queue.get()
            r = rs[i]
            if isinstance(ev, Token):
                out.append(r.piece(ev))
            elif isinstance(ev, Done):
                dones[i] = ev
                out.append(r.end_choice(ev, sources[i].extra()))
            elif isinstance(ev, Failed):
                out.append(r.broken(ApiError(ev.status, ev.message, ev.code)))
                yield b"".join(out)
                return
            if queue.empty():
                yield b"".join(out)
                out = []
        ordered = [dones[i] for i in range(len(rs))]
        out.append(rs[0].tail(merged_usage(ordered), ordered[0].fingerprint))
        yield b"".join(out)
    except Exception as exc:  # headers are out: a bug here must still end the stream properly
        log_event(log, logging.ERROR, "stream failed", error=repr(exc), exc_info=True)
        yield b"".join((*out, rs[0].broken(ApiError(500, "internal error (see the log)", "internal_error"))))
    finally:
        for p in pumps:
            p.cancel()
        for s in sources:
            s.close()


async def whole_choices(sources: list[EventSource], rs: list[Any], firsts: Sequence[Event]) -> tuple[dict[str, Any], Done]:
    """A request for ``n`` choices as one whole answer: every choice's, in order, with the merged usage."""
    tasks = [asyncio.ensure_future(whole(s, r, f)) for s, r, f in zip(sources, rs, firsts)]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:  # one choice failed (or the client left): the others stop too
        for t in tasks:
            t.cancel()
        raise
    finally:
        for s in sources:
            s.close()
    body = dict(results[0][0])
    body["choices"] = [b["choices"][0] for b, _ in results]
    body["usage"] = merged_usage([d for _, d in results])
    return body, results[0][1]

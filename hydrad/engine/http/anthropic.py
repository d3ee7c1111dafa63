"""Anthropic's Messages API on the engine: ``POST /v1/messages``.

Parsed by :mod:`hydrad.wire.anthropic` into the request a chat completion makes, then served by
the chat path's own steps (:mod:`hydrad.engine.http.generation`: admission, the wait for the first
event, disconnect handling, cancellation) and answered in Anthropic's shapes, errors included.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common.eventstream import EventStream
from hydrad.common.logs import log_event
from hydrad.engine.core import EngineCore
from hydrad.engine.http.context import ctx_of
from hydrad.engine.http.generation import SSE_HEADERS, gather, start
from hydrad.engine.requests import Done, Failed, RequestHandle, Token, Usage
from hydrad.wire import anthropic
from hydrad.wire.openai import ApiError

log = logging.getLogger("hydrad.http")


async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except ApiError as exc:
        return JSONResponse(anthropic.error_of(exc), status_code=exc.status, headers=exc.headers)
    except Exception as exc:
        log_event(log, logging.ERROR, "request failed", path=request.url.path, error=repr(exc), exc_info=True)
        return JSONResponse(anthropic.error_body(500, "internal error (see the engine log)"), status_code=500)


def _counts(u: Usage) -> dict[str, int]:
    return anthropic.usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


async def _messages(request: Request) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, anthropic.parse)
    model_id = ctx.check_serving(req)  # type: ignore[arg-type]  # reads only ``model``
    started = await start(request, ctx, greq, "messages", t_arrival)
    if started is None:
        return Response(status_code=499)
    handle, first, _ = started
    if handle.generation is not None:
        model_id = handle.generation.model
    rid = anthropic.new_id()
    if req.stream:
        events = anthropic.Stream(rid, model_id, tools=greq.tools is not None)
        return EventStream(_stream(ctx.core, events, handle, first), headers=SSE_HEADERS)
    got = await gather(request, ctx.core, handle, first)
    if got is None:
        return Response(status_code=499)
    tokens, done = got
    body = anthropic.message(rid, model_id, "".join(t.text for t in tokens), done.finish_reason, done.stop_word,
                             _counts(done.usage), [c for t in tokens for c in t.calls])
    return JSONResponse(body, headers={"X-Hydra-Generation": done.generation.fingerprint})


async def _stream(core: EngineCore, events: anthropic.Stream, handle: RequestHandle,
                  first: Any) -> AsyncIterator[bytes]:
    try:
        yield events.start()
        ev = first
        while True:
            if isinstance(ev, Token):
                out = events.text(ev.text) + events.calls(list(ev.calls))
                if out:
                    yield out
            elif isinstance(ev, Done):
                handle.finished = True
                yield events.end(ev.finish_reason, ev.stop_word, _counts(ev.usage))
                return
            elif isinstance(ev, Failed):
                handle.finished = True
                yield anthropic.stream_error(ev.status, ev.message)
                return
            ev = await handle.queue.get()
    finally:
        if not handle.finished:
            core.cancel(handle)

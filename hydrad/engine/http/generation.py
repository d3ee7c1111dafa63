"""The OpenAI generation endpoints (``/v1/chat/completions``, ``/v1/completions``): parse, admit,
then answer whole or as server-sent events, cancelling the request when its client goes away."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common.logs import log_event
from hydrad.common.eventstream import EventStream
from hydrad.common.serving import until_disconnected
from hydrad.common.prepare import client_key
from hydrad.engine.core import EngineCore, RequestRefused
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.requests import Done, Failed, Progress, RequestHandle, Token
from hydrad.wire import logprobs as lp
from hydrad.wire import openai, toolcalls
from hydrad.wire.openai import ApiError, overflow_details
from hydrad.wire.requests import GenRequest

log = logging.getLogger("hydrad.http")


async def chat(request: Request) -> Response:
    return await generate(request, "chat")


async def completions(request: Request) -> Response:
    return await generate(request, "completion")


async def generate(request: Request, kind: str) -> Response:
    ctx = ctx_of(request)
    core = ctx.core
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, lambda raw: openai.parse(kind, raw))
    model_id = ctx.check_serving(req)
    started = await start(request, ctx, greq, "messages" if kind == "chat" else "prompt", t_arrival)
    if started is None:
        return Response(status_code=499)
    handle, first, lag = started
    rid = openai.new_id(kind)
    if handle.generation is not None:  # the generation that took the request, not the one asked at arrival
        model_id = handle.generation.model
    if req.stream:
        return EventStream(_stream(core, kind, rid, model_id, req, handle, first, lag, t_arrival), headers=SSE_HEADERS)
    got = await gather(request, core, handle, first)
    if got is None:
        return Response(status_code=499)
    tokens, ev = got
    probs = None if greq.logprobs is None else lp.render(kind, [p for t in tokens for p in t.probs])
    return JSONResponse(openai.full_response(
        kind, rid, model_id, "".join(t.text for t in tokens), ev.finish_reason, ev.usage.openai(),
        ev.generation.fingerprint, {**timings(ev), **lag, **served(t_arrival)}, probs, [c for t in tokens for c in t.calls]),
        headers={"X-Hydra-Generation": ev.generation.fingerprint})


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


GONE = object()
"""Put in a request's event queue when its client leaves before the first event."""


async def _wake_when_gone(request: Request, handle: RequestHandle) -> None:
    await until_disconnected(request)
    handle.queue.put_nowait(GONE)


def _queued_gone(watch: asyncio.Future[None]) -> bool:
    """Whether the watcher finished (the client left) after the first event came: GONE is queued
    behind that event. A watcher still pending has only been asked to stop; one that failed tells
    nothing about the client."""
    return watch.done() and not watch.cancelled() and watch.exception() is None


async def start(request: Request, ctx: HttpContext, greq: GenRequest, prompt_field: str,
                t_arrival: float) -> tuple[RequestHandle, Token | Done | Progress, dict[str, Any]] | None:
    """Submit a parsed request and wait for its first event: the handle, that event, and where the
    time to it went, server side (parsing and queueing, prefill, hand-over to the loop). A failure
    before any token is raised as the ApiError it stands for. A request that asked for prompt
    progress gets a :class:`Progress` first: its reader measures the lag again at its first token.

    None when the client left before the first event: the request is cancelled, so one queued behind
    busy slots is never prefilled for nobody (a client that gave up on a slow server used to leave its
    prompt in the queue, and every retry added another)."""
    core = ctx.core
    greq.client = client_key(request)
    try:
        await core.prepare(greq)
    except RequestRefused as exc:
        overflow = exc.code == "context_length_exceeded"
        raise ApiError(exc.status, str(exc), exc.code, prompt_field if overflow else None,
                       details=overflow_details(exc.n_prompt_tokens, exc.n_ctx) if overflow else None) from None
    handle = core.submit(greq)
    watch = asyncio.ensure_future(_wake_when_gone(request, handle))
    try:
        first = await handle.queue.get()
    except asyncio.CancelledError:
        core.cancel(handle)
        raise
    finally:
        watch.cancel()
    if first is GONE or _queued_gone(watch):
        core.cancel(handle)
        log_event(log, logging.INFO, "client disconnected before the first token; request cancelled", req=handle.id)
        return None
    lag = lag_of(handle, t_arrival, time.monotonic())
    if isinstance(first, Failed):
        handle.finished = True
        raise ApiError(first.status, first.message, first.code,
                       headers={"Retry-After": "1"} if first.status == 503 else None,
                       details=overflow_details(first.n_prompt_tokens, first.n_ctx))
    return handle, first, lag


def lag_of(handle: RequestHandle, t_arrival: float, t_event: float) -> dict[str, Any]:
    """Where the time to the first token (arriving at ``t_event``) went, server side."""
    return {"server_ttft_ms": round((t_event - t_arrival) * 1000, 3),
            "to_engine_ms": round((handle.t_enqueued - t_arrival) * 1000, 3) if handle.t_enqueued else None,
            "admit_ms": round((handle.t_admitted - t_arrival) * 1000, 3) if handle.t_admitted else None,
            "first_token_handoff_ms": round((t_event - handle.t_first_token) * 1000, 3)
            if handle.t_first_token else None}


def served(t_arrival: float) -> dict[str, float]:
    """``server_ms``: from the request's arrival at its handler to the handler holding its last event.
    A client's own time for the request less this is what the server's HTTP layer, the network and the
    client took; this less ``server_ttft_ms`` and ``predicted_ms`` is the last event's way from the
    engine thread to the handler. A benchmark reads a long response's time by these."""
    return {"server_ms": round((time.monotonic() - t_arrival) * 1000, 3)}


async def gather(request: Request, core: EngineCore, handle: RequestHandle,
                 first: Any) -> tuple[list[Token], Done] | None:
    """A non-streamed request's text events and its end; None when the client went away first
    (then the request is cancelled: nobody would read what it generates)."""
    tokens: list[Token] = []
    ev: Any = first
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        while True:
            if isinstance(ev, Token):
                tokens.append(ev)
            elif isinstance(ev, Done):
                handle.finished = True
                return tokens, ev
            elif isinstance(ev, Failed):
                handle.finished = True
                raise ApiError(ev.status, ev.message, ev.code)
            if handle.queue.empty():
                nxt = asyncio.ensure_future(handle.queue.get())
                await asyncio.wait((nxt, gone), return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():  # the client went away: stop generating for nobody
                    nxt.cancel()
                    log_event(log, logging.INFO, "client disconnected; request cancelled", req=handle.id)
                    return None
                ev = nxt.result()
            else:
                ev = handle.queue.get_nowait()
    finally:
        gone.cancel()
        core.cancel(handle) if not handle.finished else None


async def _stream(core: EngineCore, kind: str, rid: str, model_id: str, req: openai._Common, handle: RequestHandle,
                  first: Any, lag: dict[str, Any], t_arrival: float) -> AsyncIterator[bytes]:
    created = int(time.time())
    fp = handle.generation.fingerprint if handle.generation else ""
    offsets = lp.TextOffsets() if handle.request.logprobs is not None else None
    n_calls = 0
    try:
        if kind == "chat":
            yield openai.chunk(kind, rid, model_id, created, "", None, fp, first=True)
        ev = first
        while True:
            if isinstance(ev, Token):
                probs = None if offsets is None else lp.render(kind, ev.probs, offsets)
                yield openai.chunk(kind, rid, model_id, created, ev.text, None, fp, logprobs=probs,
                                   calls=toolcalls.delta(list(ev.calls), n_calls))
                n_calls += len(ev.calls)
            elif isinstance(ev, Done):
                handle.finished = True
                fp = ev.generation.fingerprint
                yield openai.chunk(kind, rid, model_id, created, None, ev.finish_reason, fp,
                                   timings={**timings(ev), **lag, **served(t_arrival)})
                if req.include_usage():
                    yield openai.usage_chunk(kind, rid, model_id, created, ev.usage.openai(), fp)
                yield openai.DONE
                return
            elif isinstance(ev, Failed):
                handle.finished = True
                yield openai.sse(ApiError(ev.status, ev.message, ev.code).body())
                yield openai.DONE
                return
            ev = await handle.queue.get()
    finally:
        if not handle.finished:
            core.cancel(handle)


def timings(ev: Done) -> dict[str, Any]:
    """llama-server's ``timings`` object for a finished request."""
    u = ev.usage
    evaluated = u.prompt_tokens - u.cached_tokens
    return {"prompt_n": evaluated, "prompt_ms": u.prompt_ms, "queue_ms": u.queue_ms, "predicted_n": u.completion_tokens,
            "predicted_ms": u.predicted_ms, "cache_n": u.cached_tokens,
            "predicted_per_second": round(u.completion_tokens / (u.predicted_ms / 1000), 2) if u.predicted_ms else None}

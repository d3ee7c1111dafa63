"""The engine door's generation path: parse, prepare (off the loop), admit, wait for the first
event, then answer whole or as server-sent events through the dialect's renderer
(:mod:`hydrad.wire.render`, driven by :mod:`hydrad.wire.answering` as on the front door),
cancelling the request when its client goes away. The OpenAI endpoints are here; Anthropic's and
llama-server's native ones parse their own way and end in :func:`answer` too."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Callable, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.wire import answering
from hydrad.common.logs import log_event
from hydrad.common.eventstream import EventStream
from hydrad.common.serving import CancelOnLeave, until_disconnected
from hydrad.common.prepare import client_key
from hydrad.common.tenants import cache_namespace, store_quota_of, tenant_of
from hydrad.engine.core import EngineCore, RequestRefused
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.requests import Done, Failed, Progress, RequestHandle, Token
from hydrad.wire import openai, responses
from hydrad.wire.events import END
from hydrad.wire.openai import ApiError, overflow_details
from hydrad.wire.render import ChatAnswer, CompletionAnswer, Renderer, ResponsesAnswer
from hydrad.wire.render.openai import new_id
from hydrad.wire.requests import GenRequest, next_request_id

log = logging.getLogger("hydrad.http")


async def chat(request: Request) -> Response:
    return await generate(request, "chat")


async def completions(request: Request) -> Response:
    return await generate(request, "completion")


async def generate(request: Request, kind: Literal["chat", "completion"]) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, lambda raw: openai.parse(kind, raw))
    model_id = ctx.check_serving(req)
    answer_cls = ChatAnswer if kind == "chat" else CompletionAnswer
    rid = new_id(kind)

    def renderer(model: str, fingerprint: str, index: int = 0) -> Renderer:
        return answer_cls(model, fingerprint, include_usage=req.include_usage(), logprobs=greq.logprobs is not None,
                          rid=rid, index=index, post=greq.post_sampling_probs)

    field = "messages" if kind == "chat" else "prompt"
    if req.n > 1:
        return await answer_choices(request, ctx, greq, renderer, field, req.stream, model_id, t_arrival, req.n)
    return await answer(request, ctx, greq, renderer, field, req.stream, model_id, t_arrival)


async def answer_choices(request: Request, ctx: HttpContext, greq: GenRequest, renderer: Callable[..., Renderer],
                         prompt_field: str, streamed: bool, model_id: str, t_arrival: float, n: int) -> Response:
    """OpenAI's ``n``: the one prompt generated ``n`` times, each choice a request of its own in a slot
    of its own (the later ones find the prompt's KV in the first's slot: prefix sharing), answered as
    one with each choice's ``index``. More choices than the engine has slots is a 400."""
    slots = ctx.core.snapshot().slots_total
    if slots and n > slots:
        raise ApiError(400, f"n: at most {slots} choices (this engine's slots, n_parallel)", "invalid_field", "n")
    await prepared(request, ctx, greq, prompt_field)  # once: the choices share its tokens and grammar
    greqs = [greq, *(dataclasses.replace(greq, id=next_request_id()) for _ in range(n - 1))]
    started = await asyncio.gather(*(start(request, ctx, g, prompt_field, t_arrival) for g in greqs),
                                   return_exceptions=True)
    handles = [s[0] for s in started if isinstance(s, tuple)]
    failed = next((s for s in started if isinstance(s, BaseException)), None)
    if failed is not None or len(handles) < n:
        for h in handles:
            ctx.core.cancel(h)
        if failed is not None:
            raise failed
        return Response(status_code=499)
    firsts = [s[1] for s in started if isinstance(s, tuple)]
    sources: list[answering.EventSource] = [HandleEvents(ctx.core, h, f, s[2], t_arrival)
                                            for h, f, s in zip(handles, firsts, started) if isinstance(s, tuple)]
    tag = handles[0].generation
    rs = [renderer(tag.model if tag is not None else model_id, tag.fingerprint if tag is not None else "", i)
          for i in range(n)]
    if streamed:
        return EventStream(answering.stream_choices(sources, rs, firsts), headers=SSE_HEADERS)
    async with CancelOnLeave(request.receive):
        body, done = await answering.whole_choices(sources, rs, firsts)
        return JSONResponse(body, headers={"X-Hydra-Generation": done.fingerprint})
    log_event(log, logging.INFO, "client disconnected; request cancelled", req=handles[0].id)
    return Response(status_code=499)


async def responses_(request: Request) -> Response:
    """OpenAI's Responses API: the chat completion it stands for (:mod:`hydrad.wire.responses`),
    answered in the Responses shapes."""
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, responses.parse)
    model_id = ctx.check_serving(req.chat)
    return await answer(request, ctx, greq, lambda model, _fp: ResponsesAnswer(model, req.echo()), "input",
                        req.stream, model_id, t_arrival)


async def answer(request: Request, ctx: HttpContext, greq: GenRequest, renderer: Callable[[str, str], Renderer],
                 prompt_field: str, streamed: bool, model_id: str, t_arrival: float) -> Response:
    """A parsed request admitted, generated and answered by ``renderer(model, fingerprint)`` of the
    generation that took it: every generating endpoint of this door ends here."""
    started = await start(request, ctx, greq, prompt_field, t_arrival)
    if started is None:
        return Response(status_code=499)
    handle, first, lag = started
    tag = handle.generation  # the generation that took the request, not the one asked at arrival
    r = renderer(tag.model if tag is not None else model_id, tag.fingerprint if tag is not None else "")
    source = HandleEvents(ctx.core, handle, first, lag, t_arrival)
    if streamed:
        return EventStream(answering.stream(source, r, first), headers=SSE_HEADERS)
    async with CancelOnLeave(request.receive):
        body, done = await answering.whole(source, r, first)
        return JSONResponse(body, headers={"X-Hydra-Generation": done.fingerprint})
    log_event(log, logging.INFO, "client disconnected; request cancelled", req=handle.id)
    return Response(status_code=499)


class HandleEvents:
    """A request's events from the engine thread (:class:`hydrad.wire.answering.EventSource`).
    A request that asked for prompt progress got a :class:`Progress` first: the lag to its first
    token is measured again when that token comes."""

    def __init__(self, core: EngineCore, handle: RequestHandle, first: Any, lag: dict[str, Any],
                 t_arrival: float) -> None:
        self.core, self.handle, self.lag, self.t_arrival = core, handle, lag, t_arrival
        self.timed = not isinstance(first, Progress)
        if isinstance(first, END):
            handle.finished = True

    async def next(self) -> Any:
        ev = await self.handle.queue.get()
        if not self.timed and not isinstance(ev, Progress):
            self.lag.update(lag_of(self.handle, self.t_arrival, time.monotonic()))
            self.timed = True
        if isinstance(ev, END):
            self.handle.finished = True
        return ev

    def ready(self) -> bool:
        return not self.handle.queue.empty()

    def extra(self) -> dict[str, Any]:
        return {**self.lag, **served(self.t_arrival)}

    def close(self) -> None:
        if not self.handle.finished:
            self.core.cancel(self.handle)


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


GONE = object()
"""Put in a request's event queue when its client leaves before the first event."""


async def _wake_when_gone(request: Request, handle: RequestHandle) -> None:
    await until_disconnected(request)
    handle.queue.put_nowait(GONE)  # type: ignore[arg-type]  # the one non-event the queue carries


def _queued_gone(watch: asyncio.Future[None]) -> bool:
    """Whether the watcher finished (the client left) after the first event came: GONE is queued
    behind that event. A watcher still pending has only been asked to stop; one that failed tells
    nothing about the client."""
    return watch.done() and not watch.cancelled() and watch.exception() is None


async def prepared(request: Request, ctx: HttpContext, greq: GenRequest, prompt_field: str) -> None:
    """The request given its client, cache namespace and Store quota, and prepared off the loop
    (:meth:`hydrad.engine.promptprep.PromptPrep.prepare`; a request prepared already for the serving
    generation is not again); what the preparation refuses is raised as the ApiError it stands for."""
    greq.client = client_key(request)
    greq.cache_ns = cache_namespace(tenant_of(request.state), greq.cache_salt)
    greq.store_quota = store_quota_of(request.state)
    try:
        await ctx.core.prepare(greq)
    except RequestRefused as exc:
        overflow = exc.code == "context_length_exceeded"
        raise ApiError(exc.status, str(exc), exc.code, exc.param or (prompt_field if overflow else None),
                       details=overflow_details(exc.n_prompt_tokens, exc.n_ctx) if overflow else None) from None


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
    await prepared(request, ctx, greq, prompt_field)
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
        raise answering.refused(first)
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

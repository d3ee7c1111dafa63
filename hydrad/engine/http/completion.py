"""llama-server's native ``POST /completion`` (and ``POST /infill``, a completion of a prompt built
from FIM tokens) on the engine: parsed by
:mod:`hydrad.wire.native_completion`, served through the same admission, cancellation and
disconnect handling as ``/v1/completions`` (:mod:`hydrad.engine.http.generation`), answered in
llama-server's shapes: one JSON object, or server-sent ``data:`` events of ``content`` pieces
ending in an object with ``stop: true`` and the totals (no ``[DONE]`` line, as llama-server)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common.eventstream import EventStream
from hydrad.engine import fim
from hydrad.engine.core import EngineCore
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.http.generation import SSE_HEADERS, gather, lag_of, served, start, timings
from hydrad.engine.llama import ModelFreed
from hydrad.engine.requests import Done, Failed, Progress, RequestHandle, Token
from hydrad.wire import infill as infill_wire
from hydrad.wire import native_completion as native
from hydrad.wire.logprobs import TokenLogprob
from hydrad.wire.openai import ApiError, sse
from hydrad.wire.requests import GenRequest


async def completion(request: Request) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    gen = ctx.core.gen
    n_vocab = gen.model.n_vocab if gen is not None else None
    req, greq = await ctx.parsed(request, lambda raw: native.parse(raw, n_vocab))
    return await serve(request, ctx, req, greq, t_arrival)


async def infill(request: Request) -> Response:
    """llama-server's ``POST /infill``: the FIM prompt built for the model that is loaded
    (:mod:`hydrad.engine.fim`), then served exactly as a /completion of those token ids."""
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, sampling = await ctx.parsed(request, infill_wire.parse)
    ctx.check_serving(req)
    ids = await _infill_prompt(ctx, req)
    return await serve(request, ctx, req, native.gen_request(req, sampling, None, ids), t_arrival)


async def _infill_prompt(ctx: HttpContext, req: infill_wire.InfillRequest) -> list[int]:
    """The request's FIM prompt for the loaded model: 501 for a model without FIM tokens (as
    llama-server), 400 for a token id outside its vocabulary, 503 when the model goes away
    meanwhile. Tokenized on a worker thread: the extra chunks may be long."""
    gen = ctx.core.gen
    if gen is None:
        raise ApiError(503, "no model is loaded yet; retry", "no_model", headers={"Retry-After": "1"})
    lacks = fim.missing(gen.model)
    if lacks:
        raise ApiError(501, "Infill is not supported by this model: it has no FIM " + ", ".join(lacks)
                       + " token (its vocabulary must define fill-in-the-middle tokens)", "not_supported")
    prefix, suffix = infill_wire.mixed(req.input_prefix, "input_prefix"), infill_wire.mixed(req.input_suffix,
                                                                                           "input_suffix")
    for name, parts in (("input_prefix", prefix), ("input_suffix", suffix)):
        bad = next((t for t in parts if isinstance(t, int) and t >= gen.model.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"{name}: token {bad} is not in this model's vocabulary (0..{gen.model.n_vocab - 1})",
                           "invalid_field", name)
    params = ctx.core.params or gen.params
    try:
        return await asyncio.to_thread(fim.prompt, gen.model, prefix, suffix, req.input_extra, req.prompt,
                                       n_batch=gen.ctx.n_batch, n_predict=params.n_predict, n_ctx=gen.ctx.n_ctx_seq)
    except ModelFreed:
        raise ApiError(503, "the model was replaced while building the prompt; retry", "reloading",
                       headers={"Retry-After": "1"}) from None


async def serve(request: Request, ctx: HttpContext, req: native.NativeCompletionRequest, greq: GenRequest,
                t_arrival: float) -> Response:
    """A parsed /completion (or /infill) request admitted, generated and answered."""
    model_id = ctx.check_serving(req)
    started = await start(request, ctx, greq, "prompt", t_arrival)
    if started is None:
        return Response(status_code=499)
    handle, first, lag = started
    if handle.generation is not None:
        model_id = handle.generation.model
    settings = _settings(ctx, req, model_id)
    if req.stream:
        return EventStream(_stream(ctx.core, handle, first, model_id, settings, lag, t_arrival), headers=SSE_HEADERS)
    got = await gather(request, ctx.core, handle, first)
    if got is None:
        return Response(status_code=499)
    tokens, done = got
    ids = [i for t in tokens for i in t.ids] + list(done.ids) if req.return_tokens else []
    probs = None if greq.logprobs is None else [p for t in tokens for p in t.probs]
    body = _result(done, "".join(t.text for t in tokens), ids, model_id, settings, {**lag, **served(t_arrival)}, probs)
    return JSONResponse(body, headers={"X-Hydra-Generation": done.generation.fingerprint})


def _settings(ctx: HttpContext, req: native.NativeCompletionRequest, model_id: str) -> dict[str, Any]:
    snap = ctx.core.snapshot()
    p = snap.params
    defaults = {} if p is None else {k: getattr(p, k) for k in ("temperature", "top_k", "top_p", "min_p", "seed",
                                                                 "repeat_penalty", "repeat_last_n", "n_predict",
                                                                 "cache_prompt")}
    return native.generation_settings(req, defaults, snap.model.n_ctx if snap.model else None, model_id)


def _result(done: Done, content: str, ids: list[int], model_id: str, settings: dict[str, Any],
            lag: dict[str, Any], probs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    u = done.usage
    return native.result(content=content, finish_reason=done.finish_reason, stop_word=done.stop_word, tokens=ids,
                         prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens,
                         predicted=u.completion_tokens, timings={**timings(done), **lag}, model=model_id,
                         slot=done.slot, settings=settings, probs=probs)


async def _stream(core: EngineCore, handle: RequestHandle, first: Any, model_id: str, settings: dict[str, Any],
                  lag: dict[str, Any], t_arrival: float) -> AsyncIterator[bytes]:
    asked = handle.request.logprobs is not None
    timed = not isinstance(first, Progress)  # whether ``lag`` measured the first token
    try:
        ev = first
        while True:
            if isinstance(ev, Progress):
                yield native.progress_chunk(ev.body(), ev.slot, ev.total)
            elif not timed:
                lag.update(lag_of(handle, t_arrival, time.monotonic()))
                timed = True
            if isinstance(ev, Token):
                yield native.chunk(ev.text, ev.ids, ev.probs if asked else None)
            elif isinstance(ev, Done):
                handle.finished = True
                yield sse(_result(ev, "", list(ev.ids), model_id, settings, {**lag, **served(t_arrival)}))
                return
            elif isinstance(ev, Failed):
                handle.finished = True
                yield sse(ApiError(ev.status, ev.message, ev.code).body())
                return
            ev = await handle.queue.get()
    finally:
        if not handle.finished:
            core.cancel(handle)

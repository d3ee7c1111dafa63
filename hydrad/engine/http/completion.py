"""llama-server's native ``POST /completion`` on the engine: parsed by
:mod:`hydrad.wire.native_completion`, served through the same admission, cancellation and
disconnect handling as ``/v1/completions`` (:mod:`hydrad.engine.http.generation`), answered in
llama-server's shapes: one JSON object, or server-sent ``data:`` events of ``content`` pieces
ending in an object with ``stop: true`` and the totals (no ``[DONE]`` line, as llama-server)."""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hydrad.engine.core import EngineCore
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.http.generation import SSE_HEADERS, gather, start, timings
from hydrad.engine.requests import Done, Failed, RequestHandle, Token
from hydrad.wire import native_completion as native
from hydrad.wire.logprobs import TokenLogprob
from hydrad.wire.openai import ApiError, sse


async def completion(request: Request) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    gen = ctx.core.gen
    req, greq = native.parse(await ctx.body_of(request), gen.model.n_vocab if gen is not None else None)
    model_id = ctx.check_serving(req)
    handle, first, lag = await start(ctx, greq, "prompt", t_arrival)
    if handle.generation is not None:
        model_id = handle.generation.model
    settings = _settings(ctx, req, model_id)
    if req.stream:
        return StreamingResponse(_stream(ctx.core, handle, first, model_id, settings, lag),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    got = await gather(request, ctx.core, handle, first)
    if got is None:
        return Response(status_code=499)
    tokens, done = got
    ids = [i for t in tokens for i in t.ids] + list(done.ids) if req.return_tokens else []
    probs = None if greq.logprobs is None else [p for t in tokens for p in t.probs]
    body = _result(done, "".join(t.text for t in tokens), ids, model_id, settings, lag, probs)
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
                  lag: dict[str, Any]) -> AsyncIterator[bytes]:
    asked = handle.request.logprobs is not None
    try:
        ev = first
        while True:
            if isinstance(ev, Token):
                yield native.chunk(ev.text, ev.ids, ev.probs if asked else None)
            elif isinstance(ev, Done):
                handle.finished = True
                yield sse(_result(ev, "", list(ev.ids), model_id, settings, lag))
                return
            elif isinstance(ev, Failed):
                handle.finished = True
                yield sse(ApiError(ev.status, ev.message, ev.code).body())
                return
            ev = await handle.queue.get()
    finally:
        if not handle.finished:
            core.cancel(handle)

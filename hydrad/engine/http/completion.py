"""llama-server's native ``POST /completion`` (and ``POST /infill``, a completion of a prompt built
from FIM tokens) on the engine: parsed by
:mod:`hydrad.wire.native_completion`, served through the same admission, cancellation and
disconnect handling as ``/v1/completions`` (:mod:`hydrad.engine.http.generation`), answered in
llama-server's shapes by :mod:`hydrad.wire.render.native`."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.http.generation import answer
from hydrad.wire import infill as infill_wire
from hydrad.wire import native_completion as native
from hydrad.wire.render import NativeAnswer
from hydrad.wire.requests import GenRequest


async def completion(request: Request) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    gen = ctx.core.gen
    n_vocab = gen.model.n_vocab if gen is not None else None
    req, greq = await ctx.parsed(request, lambda raw: native.parse(raw, n_vocab))
    return await serve(request, ctx, req, greq, t_arrival)


async def infill(request: Request) -> Response:
    """llama-server's ``POST /infill``: a /completion whose prompt the engine builds from the
    request's parts with the serving model's FIM tokens, when it prepares the request
    (``hydrad.engine.fim``; 501 for a model without them, as llama-server)."""
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, infill_wire.parse)
    return await serve(request, ctx, req, greq, t_arrival)


async def serve(request: Request, ctx: HttpContext, req: native.NativeCompletionRequest, greq: GenRequest,
                t_arrival: float) -> Response:
    """A parsed /completion (or /infill) request admitted, generated and answered."""
    model_id = ctx.check_serving(req)
    greq.report_settings = True
    return await answer(request, ctx, greq, lambda model, _fp: NativeAnswer(req, model), "prompt", req.stream,
                        model_id, t_arrival)

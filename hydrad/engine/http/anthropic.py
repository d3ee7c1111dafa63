"""Anthropic's Messages API on the engine: ``POST /v1/messages``.

Parsed by :mod:`hydrad.wire.anthropic` into the request a chat completion makes, then served by
the chat path's own steps (:func:`hydrad.engine.http.generation.answer`: admission, the wait for
the first event, disconnect handling, cancellation) and answered by the Anthropic renderer
(:mod:`hydrad.wire.render.anthropic`), errors included.
"""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.common.logs import log_event
from hydrad.engine.http.context import ctx_of
from hydrad.engine.http.generation import answer
from hydrad.wire import anthropic
from hydrad.wire.openai import ApiError
from hydrad.wire.render import MessagesAnswer, Renderer

log = logging.getLogger("hydrad.http")


async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except ApiError as exc:
        return JSONResponse(MessagesAnswer.refusal(exc), status_code=exc.status, headers=exc.headers)
    except Exception as exc:
        log_event(log, logging.ERROR, "request failed", path=request.url.path, error=repr(exc), exc_info=True)
        return JSONResponse(MessagesAnswer.refusal(ApiError(500, "internal error (see the engine log)")),
                            status_code=500)


async def _messages(request: Request) -> Response:
    ctx = ctx_of(request)
    t_arrival = time.monotonic()
    req, greq = await ctx.parsed(request, anthropic.parse)
    model_id = ctx.check_serving(req)  # type: ignore[arg-type]  # reads only ``model``

    def renderer(model: str, _fingerprint: str) -> Renderer:
        return MessagesAnswer(model, tools=greq.tools is not None, thinking=anthropic.thinks(req))

    return await answer(request, ctx, greq, renderer, "messages", req.stream, model_id, t_arrival)

"""How many tokens a request's input makes, without generating: Anthropic's
``POST /v1/messages/count_tokens`` and llama-server's ``POST /v1/chat/completions/input_tokens`` and
``POST /v1/responses/input_tokens``, all answered ``{"input_tokens": N}``.

The body is what the generating endpoint takes (an Anthropic count needs no ``max_tokens``) and is
prepared by the same code: the chat template with its tools and the prompt's tokens, on a worker
thread (:meth:`hydrad.engine.promptprep.PromptPrep.tokenize`), so the count is the ``prompt_tokens``
that request would report.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hydrad.engine.http.context import ctx_of
from hydrad.engine.promptprep import RequestRefused
from hydrad.wire import anthropic, openai, responses
from hydrad.wire.openai import ApiError, json_object
from hydrad.wire.render import MessagesAnswer
from hydrad.wire.requests import GenRequest


def _anthropic(raw: bytes) -> GenRequest:
    """A Messages body without ``max_tokens`` (a count needs none) read as the Messages door reads one."""
    data = json_object(raw)
    return anthropic.parse_object({"max_tokens": 1, **data})[1]


async def _count(request: Request, gen_request: GenRequest) -> Response:
    ctx = ctx_of(request)
    await ctx.woken()
    gen = ctx.core.gen
    if gen is None:
        raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
    try:
        tokens = await asyncio.to_thread(ctx.core.prep.tokenize, gen, gen_request)
    except RequestRefused as exc:
        raise ApiError(exc.status, str(exc), exc.code, exc.param) from None
    return JSONResponse({"input_tokens": len(tokens)})


async def messages_count(request: Request) -> Response:
    """Anthropic's count: its errors in Anthropic's shape, as on ``/v1/messages``."""
    try:
        return await _count(request, await ctx_of(request).parsed(request, _anthropic))
    except ApiError as exc:
        return JSONResponse(MessagesAnswer.refusal(exc), status_code=exc.status, headers=exc.headers)


async def responses_count(request: Request) -> Response:
    return await _count(request, await ctx_of(request).parsed(request, lambda raw: responses.parse(raw)[1]))


async def chat_count(request: Request) -> Response:
    return await _count(request, await ctx_of(request).parsed(request, lambda raw: openai.parse("chat", raw)[1]))

"""Embeddings: OpenAI's ``POST /v1/embeddings`` and llama-server's native ``POST /embedding`` (also
``/embeddings``), with their request and answer shapes (:mod:`hydrad.wire.embeddings`).

The texts are tokenized on a worker thread (as ``/tokenize`` does: the vocabulary is read-only);
the vectors are computed on the engine thread by the generation's embedding context, between
generation steps (``engine/embedjobs.py``), and normalised here. An engine whose model is loaded
without embeddings answers 501 saying which parameters turn them on, as llama-server answers
without ``--embeddings``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hydrad.common import jsonbody
from hydrad.engine.embedder import Embedder, as_base64, normalized
from hydrad.engine.embedjobs import EmbedRefused
from hydrad.engine.generation import Generation
from hydrad.engine.http.context import HttpContext, ctx_of
from hydrad.engine.llama import ModelFreed
from hydrad.wire import embeddings as wire
from hydrad.wire.openai import ApiError



async def embeddings(request: Request) -> Response:
    """OpenAI's shape: pooled, normalised vectors (as floats or base64) and the usage."""
    ctx = ctx_of(request)
    await woken(ctx)
    gen, embedder = _serving(ctx)
    req = await ctx.parsed(request, lambda raw: wire.parse_openai(raw, gen.model.n_vocab))
    _check_model(ctx, gen, req)
    if not embedder.pooled:
        raise ApiError(400, "this engine's pooling is none (one vector per token), which OpenAI's embeddings cannot "
                       "carry; load the model with pooling: mean (or cls, last), or use /embedding",
                       "pooling_none", "input")
    tokens, vectors = await _compute(ctx, gen, embedder, req)
    encode: Callable[[Any], Any] = as_base64 if req.base64 else _floats

    def answer() -> bytes:
        data = [encode(normalized(v, req.normalize)) for v in vectors]
        return jsonbody.dumps(wire.openai_answer(gen.resolved.id, data, sum(len(t) for t in tokens)))

    return Response(await asyncio.to_thread(answer), media_type="application/json")


async def embedding(request: Request) -> Response:
    """llama-server's native shape: per input a list of vectors, one when pooled (normalised), one per
    token when the pooling is none (raw, as llama-server returns them)."""
    ctx = ctx_of(request)
    await woken(ctx)
    gen, embedder = _serving(ctx)
    req = await ctx.parsed(request, lambda raw: wire.parse_native(raw, gen.model.n_vocab))
    _check_model(ctx, gen, req)
    _, vectors = await _compute(ctx, gen, embedder, req)
    if embedder.pooled:
        answer = await asyncio.to_thread(lambda: jsonbody.dumps(wire.native_answer(
            [[_floats(normalized(v, req.normalize))] for v in vectors])))
        return Response(answer, media_type="application/json")
    return StreamingResponse(_per_token(vectors), media_type="application/json")  # type: ignore[arg-type]


_ROWS_PER_STEP = 64


def _per_token(matrices: list[Any]) -> Iterator[bytes]:
    """llama-server's answer for pooling none, one vector per token, written a token at a time:
    a context of vectors is tens of megabytes of JSON, which written whole on the event loop held
    it (and the engine's heartbeats) for seconds. Starlette runs each step on a worker thread."""
    yield b"["
    for i, matrix in enumerate(matrices):
        yield (b"," if i else b"") + b'{"index":' + str(i).encode() + b',"embedding":'
        for j in range(0, max(len(matrix), 1), _ROWS_PER_STEP):
            rows = jsonbody.dumps([_floats(row) for row in matrix[j:j + _ROWS_PER_STEP]])
            yield (b"[" if j == 0 else b",") + rows[1:-1]
        yield b"]}"
    yield b"]"


async def woken(ctx: HttpContext) -> None:
    """:meth:`HttpContext.woken` (kept here for the embedding and rerank doors that import it)."""
    await ctx.woken()


def _serving(ctx: HttpContext) -> tuple[Generation, Embedder]:
    gen = serving_generation(ctx)
    if gen.embedder is None:
        raise ApiError(501, f"this engine does not serve embeddings: its model ({gen.resolved.id}) is loaded without "
                       "them; configure embeddings: true and pooling: mean (a model reload) to turn them on", wire.DISABLED)
    if gen.embedder.rank:
        raise ApiError(400, f"this engine reranks ({gen.resolved.id} is loaded with pooling rank): its outputs are "
                       "scores, not embeddings; use /rerank", "pooling_rank")
    return gen, gen.embedder


def serving_generation(ctx: HttpContext) -> Generation:
    """The generation serving requests now; 503 while the engine stops, loads or has no model."""
    core = ctx.core
    if not core.admitting:
        raise ApiError(503, "engine is shutting down", "shutting_down", headers={"Retry-After": "5"})
    gen = core.gen
    if gen is None:
        if core.current_load is not None:
            raise ApiError(503, "the model is loading; retry", "loading", headers={"Retry-After": "1"})
        raise ApiError(503, "no model is loaded; configure one with POST /control/configure", "no_model")
    return gen


def _check_model(ctx: HttpContext, gen: Generation, req: wire.EmbedRequest) -> None:
    ctx.check_model(req.model, gen.resolved.id)


async def _compute(ctx: HttpContext, gen: Generation, embedder: Embedder,
                   req: wire.EmbedRequest) -> tuple[list[list[int]], list[Any]]:
    """The inputs' tokens and their vectors, after every bound that needs the model is checked."""
    tokens: list[list[int]] = [x if isinstance(x, list) and all(type(t) is int for t in x) else []  # type: ignore[misc]
                               for x in req.inputs]
    texts = [(i, x) for i, x in enumerate(req.inputs) if not tokens[i]]
    if texts:
        try:
            made = await asyncio.to_thread(lambda: [_tokens(gen, x) for _, x in texts])
        except ModelFreed:
            raise ApiError(503, "the model was replaced while tokenizing; retry", "reloading",
                           headers={"Retry-After": "1"}) from None
        for (i, _), t in zip(texts, made):
            tokens[i] = t
    wire.check_sizes(req, tokens, embedder.n_tokens, embedder.n_embd, embedder.pooled)
    return tokens, await computed(ctx, gen, tokens)


def _tokens(gen: Generation, x: str | list[int | str]) -> list[int]:
    """An input's tokens: text with the model's BOS; token ids and text pieces joined, each piece
    tokenized where it stands and only the first one given the BOS (llama-server's mixed prompt)."""
    if isinstance(x, str):
        return gen.model.tokenize(x, True, True)
    out: list[int] = []
    for k, piece in enumerate(x):
        if isinstance(piece, str):
            out.extend(gen.model.tokenize(piece, k == 0, True))
        else:
            out.append(piece)
    return out


async def computed(ctx: HttpContext, gen: Generation, tokens: list[list[int]]) -> list[Any]:
    """The embedding context's outputs for ``tokens`` (checked inputs), computed on the engine thread
    between generation steps; its refusals as the HTTP errors they are."""
    try:
        return await ctx.core.embed(gen.id, tokens)
    except EmbedRefused as exc:
        raise ApiError(exc.status, str(exc), exc.code,
                       headers={"Retry-After": "1"} if exc.status == 503 else None) from None


def _floats(vector: Any) -> list[float]:
    """A vector as JSON numbers; a non-finite value (a broken model) becomes 0 rather than invalid JSON."""
    import numpy as np

    return np.nan_to_num(vector, nan=0.0, posinf=0.0, neginf=0.0).tolist()  # type: ignore[no-any-return]

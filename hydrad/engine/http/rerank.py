"""Reranking: llama-server's ``POST /rerank`` (and ``/reranking``, ``/v1/rerank``, ``/v1/reranking``), with
its request and answer shapes (:mod:`hydrad.wire.rerank`).

Served by an engine whose model is a reranker loaded with ``embeddings: true`` and rank pooling (its
embedding context's classification head scores each prompt: ``engine/embedder.py``). The body is parsed
and the prompts are made and tokenized on worker threads (``engine/rerank.py``); the scores are
computed on the engine thread by the embedding context, between generation steps, as embeddings are
(``engine/embedjobs.py``); the answer is written on a worker. An engine whose model is not loaded that
way answers 501 saying so, as llama-server answers without ``--reranking``.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from hydrad.common import jsonbody
from hydrad.engine.http.context import ctx_of
from hydrad.engine.http.embeddings import computed, serving_generation, woken
from hydrad.engine.llama import ModelFreed
from hydrad.wire import rerank as wire
from hydrad.wire.openai import ApiError


async def rerank(request: Request) -> Response:
    ctx = ctx_of(request)
    await woken(ctx)
    gen = serving_generation(ctx)
    embedder = gen.embedder
    if embedder is None or embedder.prompts is None:
        how = "loaded without embeddings" if embedder is None else f"loaded with pooling {embedder.pooling}"
        raise ApiError(501, f"this engine does not rerank: its model ({gen.resolved.id}) is {how}; a reranker (a GGUF "
                       "that declares rank pooling) loaded with embeddings: true and pooling: rank (llama-server's "
                       "--reranking) serves /rerank", wire.DISABLED)
    req = await ctx.parsed(request, wire.parse)
    ctx.check_model(req.model, gen.resolved.id)
    prompts = embedder.prompts
    try:
        tokens = await asyncio.to_thread(prompts.tokens, gen.model, req.query, req.documents)
    except ModelFreed:
        raise ApiError(503, "the model was replaced while tokenizing; retry", "reloading",
                       headers={"Retry-After": "1"}) from None
    wire.check_tokens(req, tokens, embedder.n_tokens)
    outputs = await computed(ctx, gen, tokens)
    scores = [float(v[0]) if len(v) and v[0] == v[0] else 0.0 for v in outputs]  # NaN (a broken model): 0

    def answer() -> bytes:
        return jsonbody.dumps(wire.answer(req, gen.resolved.id, scores, sum(len(t) for t in tokens)))

    return Response(await asyncio.to_thread(answer), media_type="application/json")

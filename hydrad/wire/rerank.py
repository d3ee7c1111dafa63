"""Reranking requests and answers: llama-server's ``POST /rerank`` (also ``/reranking``, ``/v1/rerank`` and
``/v1/reranking``), served by an engine whose model is a reranker.

Both doors parse here, so a request the front door lets through is one the engine accepts; the bounds
that need the model (each prompt within the embedding context, the tokens of all of them) are the
engine's, with the same messages (:func:`check_tokens`).

The request takes llama-server's two dialects: Jina's (``query``, ``documents``, ``top_n``), answered
``{model, object: "list", usage: {prompt_tokens, total_tokens}, results: [{index, relevance_score}]}``,
and Hugging Face TEI's (``query``, ``texts``, ``return_text``), answered as a bare list of ``{index, score}``
(with ``text`` when ``return_text``); both sorted by score, most relevant first, the first ``top_n``
(default: all). ``return_text`` changes only TEI's answer, as in llama-server. Deliberate differences:
any other field is refused by name (llama-server ignores it), ``top_n`` must be a whole number from 0,
and a request is bounded (:data:`MAX_DOCUMENTS` documents, :data:`MAX_PROMPT_CHARS` characters of
prompts in all, the query counted once per document, before anything is tokenized).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydrad.wire.embedinputs import CHARS_PER_TOKEN, MAX_INPUTS, MAX_TOTAL_TOKENS, check_token_counts
from hydrad.wire.embeddings import model_field
from hydrad.wire.openai import INT32_MAX, ApiError, json_object

MAX_DOCUMENTS = MAX_INPUTS
"""Most documents one request scores (each a prompt of its own, with the query)."""
MAX_PROMPT_CHARS = MAX_TOTAL_TOKENS * CHARS_PER_TOKEN
"""Most characters of all the prompts of one request (the query once per document): more could not
fit :data:`hydrad.wire.embedinputs.MAX_TOTAL_TOKENS` tokens, so it is refused before any tokenizing."""
DISABLED = "reranking_disabled"
"""The error code of an engine whose model is not loaded as a reranker (501, as llama-server's
without ``--reranking``); the front door then tries another engine serving the model."""
PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")

_FIELDS = {"query", "documents", "texts", "top_n", "return_text", "model"}


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    tei: bool  # given as ``texts``: TEI's answer shape
    top_n: int
    return_text: bool = False
    model: str | None = None

    @property
    def field(self) -> str:
        return "texts" if self.tei else "documents"


def parse(raw: bytes | dict[str, Any]) -> RerankRequest:
    """A /rerank body, checked; ApiError 400 naming the field."""
    data = json_object(raw)
    extra = sorted(set(data) - _FIELDS)
    if extra:
        raise ApiError(400, f"unknown field(s): {', '.join(extra)} ({', '.join(sorted(_FIELDS))})",
                       "unsupported_field", extra[0])
    query = data.get("query")
    if not isinstance(query, str):
        raise ApiError(400, "query must be a string" if "query" in data else "query is required", "invalid_field",
                       "query")
    if "documents" in data and "texts" in data:
        raise ApiError(400, "give either documents or texts, not both", "invalid_field", "texts")
    name = "texts" if "texts" in data else "documents"
    docs = data.get(name)
    if not isinstance(docs, list) or not docs:
        raise ApiError(400, f"{name} must be a non-empty list of strings", "invalid_field", name)
    if len(docs) > MAX_DOCUMENTS:
        raise ApiError(400, f"{name}: at most {MAX_DOCUMENTS} per request (got {len(docs)})", "invalid_field", name)
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise ApiError(400, f"{name}[{i}] must be a string", "invalid_field", name)
    chars = len(docs) * len(query) + sum(len(d) for d in docs)
    if chars > MAX_PROMPT_CHARS:
        raise ApiError(400, f"{name}: the prompts (the query with each of them) hold {chars} characters; at most "
                       f"{MAX_PROMPT_CHARS} per request", "input_too_long", name)
    top_n = data.get("top_n", len(docs))
    if type(top_n) is not int or not 0 <= top_n <= INT32_MAX:
        raise ApiError(400, "top_n must be a whole number from 0", "invalid_field", "top_n")
    return_text = data.get("return_text", False)
    if type(return_text) is not bool:
        raise ApiError(400, "return_text must be true or false", "invalid_field", "return_text")
    return RerankRequest(query, docs, name == "texts", top_n, return_text, model_field(data))


def check_tokens(req: RerankRequest, tokens: list[list[int]], max_tokens: int) -> None:
    """The bounds that need the model: each prompt (query and document) within the embedding context
    (``max_tokens``, its n_ubatch), all of them within MAX_TOTAL_TOKENS."""
    check_token_counts(req.field, tokens, max_tokens, does="scores", per="prompt",
                       subject="{where}: the prompt it makes with the query")


def answer(req: RerankRequest, model: str, scores: list[float], n_tokens: int) -> dict[str, Any] | list[dict[str, Any]]:
    """llama-server's answer: the documents' scores, most relevant first (the earlier document first
    among equals), the first ``top_n``; Jina's object, or TEI's bare list for a request of ``texts``."""
    label = "score" if req.tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        item: dict[str, Any] = {"index": i, label: scores[i]}
        if req.tei and req.return_text:
            item["text"] = req.documents[i]
        results.append(item)
    if req.tei:
        return results
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}

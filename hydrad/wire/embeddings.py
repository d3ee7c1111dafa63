"""Embedding requests and answers: OpenAI's ``POST /v1/embeddings`` and llama-server's native
``POST /embedding`` (also ``/embeddings``).

Both doors parse here, so a request the front door lets through is one the engine accepts; the
checks that need the model (token ids in its vocabulary, an input's length against the embedding
context, ``dimensions``) are the engine's, with the same messages (:func:`check_sizes`).

Inputs take llama-server's shapes (:mod:`hydrad.wire.embedinputs`): a string, token ids mixed with
text, an object of text, or a list of those (several inputs, answered in order); images are refused
(no embedding model here takes them), and an empty string too (llama-server refuses it only when
the model adds no BOS token). Vectors are normalised as llama-server does (``embd_normalize``, default
2: Euclidean) when pooled; per-token vectors (pooling ``none``, ``/embedding`` only) are raw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hydrad.wire.embedinputs import MAX_INPUTS, MAX_TOTAL_TOKENS, Input, check_token_counts, inputs as _inputs  # noqa: F401 (MAX_INPUTS: read here by callers)
from hydrad.wire.openai import INT32_MAX, MAX_MODEL_NAME, ApiError, json_object

MAX_OUTPUT_FLOATS = 4 << 20
"""Most numbers one answer may carry (per-token vectors grow with the input: about 80 MB of JSON)."""
MAX_NORM = 32
"""Largest ``embd_normalize`` p-norm taken."""
DISABLED = "embeddings_disabled"
"""The error code of an engine whose model is loaded without embeddings (501); the front door then
tries another engine serving the model."""

_OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "embd_normalize"}
_NATIVE_FIELDS = {"content", "input", "model", "embd_normalize"}
_MODEL = re.compile(r"^[^\x00-\x1f\x7f]+$")


@dataclass(frozen=True)
class EmbedRequest:
    """A checked request: ``inputs`` (strings or token-id lists, in order) read from ``field``."""

    inputs: list[Input]
    field: str
    model: str | None = None
    base64: bool = False
    normalize: int = 2
    dimensions: int | None = None


def model_field(data: dict[str, Any]) -> str | None:
    """A body's ``model``, checked (the front door routes by it; an engine names the model it serves)."""
    model = data.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not 1 <= len(model) <= MAX_MODEL_NAME or not _MODEL.match(model):
        raise ApiError(400, f"model must be a name of 1 to {MAX_MODEL_NAME} printable characters", "invalid_field",
                       "model")
    return model


def _normalize(data: dict[str, Any]) -> int:
    value = data.get("embd_normalize")
    if value is None:
        return 2
    if type(value) is not int or not -1 <= value <= MAX_NORM:
        raise ApiError(400, f"embd_normalize must be an integer from -1 to {MAX_NORM} (-1 none, 0 int16 range, "
                       "1 taxicab, 2 Euclidean, p > 2 the p-norm)", "invalid_field", "embd_normalize")
    return value


def parse_openai(raw: bytes | dict[str, Any], n_vocab: int | None = None) -> EmbedRequest:
    """A /v1/embeddings body (fields OpenAI defines, plus llama-server's ``embd_normalize``; others are
    ignored, as on the other OpenAI endpoints). ``n_vocab`` bounds token ids when known."""
    data = json_object(raw)
    if "input" not in data:
        raise ApiError(400, "input is required", "invalid_field", "input")
    fmt = data.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise ApiError(400, 'encoding_format must be "float" or "base64"', "invalid_field", "encoding_format")
    dims = data.get("dimensions")
    if dims is not None and (type(dims) is not int or not 1 <= dims <= INT32_MAX):
        raise ApiError(400, "dimensions must be a positive integer", "invalid_field", "dimensions")
    user = data.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise ApiError(400, "user must be a string of at most 256 characters", "invalid_field", "user")
    model = model_field(data)
    return EmbedRequest(_inputs(data["input"], "input", n_vocab), "input", model, fmt == "base64", _normalize(data),
                        dims)


def parse_native(raw: bytes | dict[str, Any], n_vocab: int | None = None) -> EmbedRequest:
    """An /embedding body: ``content`` (or ``input``, which llama-server reads first), ``embd_normalize``
    and, for a pool, ``model``; any other field is refused by name."""
    data = json_object(raw)
    extra = sorted(set(data) - _NATIVE_FIELDS)
    if extra:
        raise ApiError(400, f"unknown field(s): {', '.join(extra)} ({', '.join(sorted(_NATIVE_FIELDS))})",
                       "unsupported_field", extra[0])
    if "input" in data and "content" in data:
        raise ApiError(400, "give either input or content, not both", "invalid_field", "content")
    name = "input" if "input" in data else "content"
    if name not in data:
        raise ApiError(400, "content is required", "invalid_field", "content")
    model = model_field(data)
    return EmbedRequest(_inputs(data[name], name, n_vocab), name, model, False, _normalize(data))


def check_sizes(req: EmbedRequest, tokens: list[list[int]], max_tokens: int, n_embd: int, pooled: bool) -> None:
    """The bounds that need the model: each input within the embedding context (``max_tokens``, its
    n_ubatch), all of them within MAX_TOTAL_TOKENS, the answer within MAX_OUTPUT_FLOATS, ``dimensions``
    the model's own."""
    name = req.field
    check_token_counts(name, tokens, max_tokens)
    total = sum(len(t) for t in tokens)
    floats = (len(tokens) if pooled else total) * n_embd
    if floats > MAX_OUTPUT_FLOATS:
        raise ApiError(400, f"{name}: the answer would hold {floats} numbers (one vector of {n_embd} per "
                       f"{'input' if pooled else 'token'}); at most {MAX_OUTPUT_FLOATS}", "input_too_long", name)
    if req.dimensions is not None and req.dimensions != n_embd:
        raise ApiError(400, f"dimensions: this model's embeddings have {n_embd} dimensions and cannot be shortened",
                       "unsupported_field", "dimensions")


def openai_answer(model: str, vectors: list[Any], n_tokens: int) -> dict[str, Any]:
    """OpenAI's list of embeddings (each a list of floats, or a base64 string), with the usage."""
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def native_answer(vectors: list[list[list[float]]]) -> list[dict[str, Any]]:
    """llama-server's /embedding answer: per input its index and a list of vectors (one when pooled,
    one per token when not)."""
    return [{"index": i, "embedding": v} for i, v in enumerate(vectors)]

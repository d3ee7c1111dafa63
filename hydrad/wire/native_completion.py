"""llama-server's native ``POST /completion``: its request fields and its answer shapes.

Clients written for llama-server (its web UI, scripts, most "llama.cpp" integrations) speak this
rather than OpenAI's completions. The request is read by the same model as ``/v1/completions``
(:mod:`hydrad.wire.openai`: the same limits, the same refusal of fields the engine cannot honour,
the same grammar checks) plus what only this endpoint has: a prompt given as token ids,
``return_tokens`` and a per-request ``cache_prompt``. Both doors parse here, so a request the
front door lets through is one the engine accepts.

``n_probs`` (up to :data:`hydrad.wire.logprobs.MAX_N_PROBS`) adds llama-server's
``completion_probabilities``: log-probabilities over the full vocabulary, before the sampling chain,
or with ``post_sampling_probs: true`` the probabilities after it (``prob``/``top_probs``).
``timings_per_token: true`` on a stream puts the timings so far in every piece, as llama-server.
``return_progress: true`` on a stream adds llama-server's ``prompt_progress`` events while the prompt
is prefilled (:func:`progress_chunk`); llama-server sends them only on a stream, and so does the engine.

``n_keep`` (tokens of the prompt a context shift keeps; -1: all of it) and ``n_cache_reuse`` (the
smallest cached chunk reused by shifting its KV) override the engine's ``n_keep`` and
``n_cache_reuse``; ``truncated`` is true, as in llama-server, when the context filled: it was shifted
(the engine's ``ctx_shift``) or the generation ended there.

A prompt may be llama-server's object ``{"prompt_string": "... <__media__> ...", "multimodal_data":
["<base64>"]}``: images (hydrad.wire.images bounds them) for an engine whose model has a projector
(``mmproj``), one marker in the string for each.

Deliberate differences from llama-server: one prompt per request (llama-server also takes a list
of prompts and mixed tokens and strings); the tokens
reported in ``completion_probabilities`` are those of ``content`` (no entry for the end-of-generation
token, none for a token wholly inside the stop string that ended it).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt, ValidationError

from hydrad.common.params import validation_message
from hydrad.wire import images as img
from hydrad.wire import logprobs as lp
from hydrad.wire.openai import (
    INT32_MAX, POST_SAMPLING_DESCRIPTION, ApiError, ChatRequest, CompletionRequest, _Common, checked_sampling, json_object, unsupported,
)
from hydrad.wire.requests import GenRequest, SamplingOverrides

# llama-server's own fields that change what is generated or returned, which the engine does not
# do: refused by name unless set to llama-server's default (the OpenAI list in openai.py covers
# n_probs, mirostat, typical_p, DRY, XTC and the rest).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n_cmpl": (None, 1), "n_indent": (None, 0), "t_max_predict_ms": (None, 0), "min_keep": (None, 0),
    "response_fields": (None, []),
}


_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": INT32_MAX}}
_MEDIA_PROMPT = {"type": "object", "required": ["prompt_string"], "properties": {
    "prompt_string": {"type": "string"}, "multimodal_data": {"type": "array", "items": {"type": "string"}}}}
PROMPT_SCHEMA = {"anyOf": [{"type": "string"}, _TOKEN_IDS, _MEDIA_PROMPT, {
    "type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [{"type": "string"}, _TOKEN_IDS, _MEDIA_PROMPT]}}]}
"""What :func:`_prompt` takes: a string, token ids, llama-server's object of a string and its images, or a
list holding one of those."""


class NativeCompletionRequest(_Common):
    OTHER_DOORS_FIELDS = {"logprobs": (None, False), "top_logprobs": (None, 0), **ChatRequest.TOOL_FIELDS,
                          **ChatRequest.REASONING_FIELDS}
    prompt: Any = Field(json_schema_extra=PROMPT_SCHEMA)
    cache_prompt: bool | None = None
    return_tokens: bool = False
    return_progress: StrictBool = False
    n_probs: StrictInt | None = Field(None, ge=0, le=lp.MAX_N_PROBS)
    post_sampling_probs: StrictBool = Field(False, description=POST_SAMPLING_DESCRIPTION)
    n_keep: StrictInt | None = Field(None, ge=-1, le=INT32_MAX)
    n_cache_reuse: StrictInt | None = Field(None, ge=0, le=INT32_MAX)

    def wants_logprobs(self) -> int | None:
        """llama-server reports probabilities only for ``n_probs`` above 0."""
        return self.n_probs or None

    def limit(self) -> int | None:
        """``n_predict: -1`` asks for "until end of generation or the context is full", not the
        engine's default limit (which an absent ``n_predict`` gets)."""
        if self.max_tokens is None and self.max_completion_tokens is None and self.n_predict == -1:
            return INT32_MAX
        return super().limit()


# The request bodies a pydantic model parses, by path, at both daemons' doors: what /openapi.json
# describes them with (hydrad.common.openapi).
REQUEST_MODELS: dict[str, type[_Common]] = {
    "/v1/chat/completions": ChatRequest, "/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/completion": NativeCompletionRequest, "/completions": NativeCompletionRequest,
}


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= INT32_MAX


def _prompt(value: Any, n_vocab: int | None) -> tuple[str | None, list[int] | None, list[bytes] | None]:
    """(text, token ids, images) of llama-server's prompt shapes this engine takes: a string, a list of
    token ids, an object ``{"prompt_string", "multimodal_data"}`` (base64 images, one for each
    :data:`~hydrad.wire.images.MARKER` in the string), or a list holding one of those."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list, dict)):
        value = value[0]
    if isinstance(value, dict):
        return _media_prompt(value)
    if isinstance(value, str):
        return value, None, None
    if not isinstance(value, list) or not value:
        raise ApiError(400, "prompt must be a string or a non-empty list of token ids", "invalid_field", "prompt")
    if not all(_is_id(t) for t in value):
        if any(isinstance(t, (str, list, dict)) for t in value):
            raise ApiError(400, "prompt: one prompt per request, a string or a list of token ids (several prompts, "
                           "mixed strings and tokens are not supported)",
                           "unsupported_field", "prompt")
        raise ApiError(400, "prompt: token ids must be non-negative integers", "invalid_field", "prompt")
    if n_vocab is not None:
        bad = next((t for t in value if t >= n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token {bad} is not in this model's vocabulary (0..{n_vocab - 1})",
                           "invalid_field", "prompt")
    return None, list(value), None


def _media_prompt(value: dict[str, Any]) -> tuple[str, None, list[bytes] | None]:
    """llama-server's ``{"prompt_string": ..., "multimodal_data": [base64, ...]}``: as many markers in the
    string as images, each image bounded (hydrad.wire.images) before it is decoded."""
    text = value.get("prompt_string")
    if not isinstance(text, str):
        raise ApiError(400, "prompt.prompt_string must be a string", "invalid_field", "prompt.prompt_string")
    extra = set(value) - {"prompt_string", "multimodal_data"}
    if extra:
        raise ApiError(400, f"prompt: unknown member {sorted(extra)[0]!r} (prompt_string and multimodal_data are "
                       "read)", "invalid_field", "prompt")
    data = value.get("multimodal_data") or []
    if not isinstance(data, list):
        raise ApiError(400, "prompt.multimodal_data must be a list of base64 strings", "invalid_field",
                       "prompt.multimodal_data")
    param = "prompt.multimodal_data"
    try:
        img.count_ok(len(data), param)
        images = [img.decode_base64(item, f"{param}[{i}]") for i, item in enumerate(data)]
    except img.ImageRefused as exc:
        raise ApiError(exc.status, str(exc), exc.code, exc.param) from None
    if text.count(img.MARKER) != len(images):
        raise ApiError(400, f"prompt.prompt_string has {text.count(img.MARKER)} {img.MARKER} markers for "
                       f"{len(images)} images of multimodal_data: one marker for each", "invalid_field",
                       "prompt.multimodal_data")
    return text, None, images or None


def parse(raw: bytes | dict[str, Any], n_vocab: int | None = None) -> tuple[NativeCompletionRequest, GenRequest]:
    """A /completion body as the request and its GenRequest; ApiError 400 naming the field.
    ``n_vocab`` (the engine's, when it has a model) bounds token-id prompts here; the engine
    thread checks them again against the model that takes the request."""
    data = json_object(raw)
    if "prompt" not in data:
        raise ApiError(400, "prompt is required", "invalid_field", "prompt")
    req = validated(NativeCompletionRequest, data)
    sampling = checked_sampling(req)
    text, ids, images = _prompt(req.prompt, n_vocab)
    gen = gen_request(req, sampling, text, ids)
    gen.images = images
    return req, gen


def validated(model: type[NativeCompletionRequest], data: dict[str, Any]) -> Any:
    """``data`` read as ``model`` (this endpoint's request or one built on it, like /infill's),
    with llama-server's fields the engine does not honour refused by name; ApiError 400."""
    try:
        req = model(**data)
    except ValidationError as exc:
        msg, names = validation_message(exc)
        raise ApiError(400, msg, "invalid_field", names[0] if names else None) from None
    extra = req.model_extra or {}
    bad = [k for k, neutral in _UNSUPPORTED.items() if k in extra and extra[k] not in neutral]
    if bad:
        raise unsupported(bad)
    return req


def gen_request(req: NativeCompletionRequest, sampling: SamplingOverrides, text: str | None,
                ids: list[int] | None) -> GenRequest:
    """The GenRequest of a validated request (``sampling``: its checked sampling) whose prompt is
    ``text`` or the token ids ``ids``.
    Prompt progress is sent only on a stream, as llama-server does."""
    return GenRequest(prompt=text, prompt_ids=ids, max_tokens=req.limit(), stop=req.stops(),
                      sampling=sampling, ignore_eos=req.ignore_eos, slot=req.slot(),
                      cache_prompt=req.cache_prompt, cache_salt=req.cache_salt,
                      return_tokens=req.return_tokens or req.stream,
                      logprobs=req.wants_logprobs(), return_progress=req.stream and req.return_progress,
                      n_keep=req.n_keep, n_cache_reuse=req.n_cache_reuse, lora=req.lora,
                      post_sampling_probs=req.post_sampling_probs, timings_per_token=req.stream and req.timings_per_token)

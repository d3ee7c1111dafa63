"""llama-server's ``POST /infill`` (fill in the middle): its request fields.

A code editor sends the text before the cursor (``input_prefix``), the text after it
(``input_suffix``), other files of the project (``input_extra``: ``{"filename", "text"}`` chunks)
and optionally the start of the middle (``prompt``); the model writes the middle. Every other field
is /completion's (:mod:`hydrad.wire.native_completion`: the same sampling fields, limits and
refusals), and so is the answer. The prompt is made of the model's FIM tokens, so it is assembled on
the engine (:mod:`hydrad.engine.fim`); both doors check the fields here first.

Deliberate differences from llama-server: ``prompt`` is one string (llama-server also takes
token lists and several prompts, and uses only the first); ``input_extra`` holds at most
:data:`MAX_EXTRA` chunks; a malformed field is a 400 naming it, where llama-server goes on
after some of its checks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from hydrad.wire.native_completion import NativeCompletionRequest, gen_request, validated
from hydrad.wire.openai import INT32_MAX, ApiError, checked_sampling, json_object
from hydrad.wire.requests import FimChunk, GenRequest, InfillParts

MAX_EXTRA = 1024
"""Most ``input_extra`` chunks: far more than an editor sends, few enough that a request of tiny
chunks cannot make the engine tokenize an unbounded list."""


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: StrictStr
    filename: StrictStr = "tmp"  # llama-server's name for a chunk without one


_MIXED_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "items": {
    "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": INT32_MAX}]}}]}
"""What :func:`mixed` takes."""


class InfillRequest(NativeCompletionRequest):
    prompt: StrictStr = ""
    input_prefix: Any = Field(json_schema_extra=_MIXED_SCHEMA)
    input_suffix: Any = Field(json_schema_extra=_MIXED_SCHEMA)
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA)


Mixed = list[str | int]
"""A text as llama-server's ``tokenize_mixed`` reads one: strings (tokenized without special
tokens) and token ids, in order."""


def mixed(value: Any, name: str) -> Mixed:
    """``input_prefix`` or ``input_suffix`` as a list of texts and token ids; ApiError 400 naming it."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) or (type(v) is int and 0 <= v <= INT32_MAX)
                                       for v in value):
        return list(value)
    raise ApiError(400, f"{name} must be a string or a list of strings and token ids", "invalid_field", name)


def parse(raw: bytes | dict[str, Any]) -> tuple[InfillRequest, GenRequest]:
    """An /infill body as the request and its GenRequest, whose prompt the engine builds from its
    ``infill`` parts; ApiError 400 naming the field."""
    data = json_object(raw)
    for name in ("input_prefix", "input_suffix"):
        if name not in data:
            raise ApiError(400, f"{name} is required", "invalid_field", name)
    req = validated(InfillRequest, data)
    sampling = checked_sampling(req)
    parts = InfillParts(prefix=mixed(req.input_prefix, "input_prefix"), suffix=mixed(req.input_suffix, "input_suffix"),
                        extra=[FimChunk(text=c.text, filename=c.filename) for c in req.input_extra], middle=req.prompt)
    gen = gen_request(req, sampling, None, None)
    gen.infill = parts
    return req, gen

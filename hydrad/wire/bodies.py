"""The request bodies of both daemons' doors, by path, as ``/openapi.json`` describes them
(:func:`hydrad.common.openapi.describe`).

A pydantic model where the door parses with one (its schema carries the hand checks written beside
each model); otherwise a JSON schema written here from the parser's own checks. Each says what the
parser requires (required fields, types, ranges, the fields it knows when it refuses the others) and
never more: a body a schema allows may still be refused with a 400, but no body the parser accepts
falls outside it. A path not listed here takes "a JSON object".

The front door forwards ``/tokenize``, ``/detokenize`` and ``/apply-template`` to an engine after
taking out ``model`` (which picks the engine), so there their schemas list ``model`` among the known
fields, while an engine's own door refuses it by name: hence two maps, :data:`ENGINE_BODIES` and
:data:`FRONT_DOOR_BODIES`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from hydrad.wire import embeddings, rerank
from hydrad.wire.anthropic import MessagesRequest
from hydrad.wire.infill import InfillRequest
from hydrad.wire.native_completion import REQUEST_MODELS
from hydrad.wire.requests import MAX_LORA_ENTRIES
from hydrad.wire.openai import BUDGET_FIELDS, CHAT_MESSAGES_SCHEMA, INT32_MAX, MAX_MODEL_NAME

MODEL = {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME, "pattern": "^[^\\x00-\\x1f\\x7f]+$"}
_ID = {"type": "integer", "minimum": 0, "maximum": INT32_MAX}
_PIECES = {"type": "array", "minItems": 1, "items": {"anyOf": [_ID, {"type": "string", "minLength": 1}]}}
_TEXT_OBJECT = {"anyOf": [
    {"type": "object", "required": ["prompt_string"], "additionalProperties": False,
     "properties": {"prompt_string": {"type": "string", "minLength": 1}}},
    {"type": "object", "required": ["content"], "additionalProperties": False,
     "properties": {"content": {"type": "array", "minItems": 1, "items": {
         "type": "object", "required": ["type", "text"], "additionalProperties": False,
         "properties": {"type": {"const": "text"}, "text": {"type": "string", "minLength": 1}}}}}}]}
_ONE_INPUT = {"anyOf": [{"type": "string", "minLength": 1}, _PIECES, _TEXT_OBJECT]}
EMBEDDING_INPUT = {"anyOf": [_ONE_INPUT, {"type": "array", "minItems": 1, "maxItems": embeddings.MAX_INPUTS,
                                          "items": _ONE_INPUT}]}
"""What ``hydrad.wire.embedinputs.inputs`` takes: a non-empty string, token ids mixed with text, an
object of text, or a list of those."""
_NORMALIZE = {"type": "integer", "minimum": -1, "maximum": embeddings.MAX_NORM}
_MODEL_OR_NULL = {"anyOf": [MODEL, {"type": "null"}]}
_BUDGET = {"type": ["integer", "null"], "minimum": -1, "maximum": INT32_MAX}


def _closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


def _forwarded(model: bool) -> dict[str, dict[str, Any]]:
    """The engine's own ``/tokenize``, ``/detokenize`` and ``/apply-template`` (which refuse any
    field they do not know), and with ``model`` as the front door takes them."""
    more = {"model": _MODEL_OR_NULL} if model else {}
    return {
        "/tokenize": _closed({"content": {"type": "string"}, "add_special": {"type": "boolean"},
                              "parse_special": {"type": "boolean"}, "with_pieces": {"type": "boolean"}, **more},
                             ["content"]),
        "/detokenize": _closed({"tokens": {"type": "array", "items": _ID}, **more}, ["tokens"]),
        "/apply-template": _closed({"messages": {"type": "array", **CHAT_MESSAGES_SCHEMA}, "tools": {},
                                    "tool_choice": {}, "parallel_tool_calls": {},
                                    "chat_template_kwargs": {"type": ["object", "null"]},
                                    "add_generation_prompt": {"type": "boolean"},
                                    **{name: _BUDGET for name in BUDGET_FIELDS}, **more}, ["messages"]),
    }


OPENAI_EMBEDDINGS = {"type": "object", "required": ["input"], "properties": {
    "input": EMBEDDING_INPUT, "model": _MODEL_OR_NULL, "encoding_format": {"enum": ["float", "base64", None]},
    "dimensions": {"type": ["integer", "null"], "minimum": 1, "maximum": INT32_MAX},
    "user": {"type": ["string", "null"], "maxLength": 256}, "embd_normalize": {"anyOf": [_NORMALIZE, {"type": "null"}]}}}
NATIVE_EMBEDDING = {**_closed({"content": EMBEDDING_INPUT, "input": EMBEDDING_INPUT,
                               "embd_normalize": {"anyOf": [_NORMALIZE, {"type": "null"}]},
                               "model": _MODEL_OR_NULL}, []),
                    "oneOf": [{"required": ["content"]}, {"required": ["input"]}]}

_DOCUMENTS = {"type": "array", "minItems": 1, "maxItems": rerank.MAX_DOCUMENTS, "items": {"type": "string"}}
RERANK = {**_closed({"query": {"type": "string"}, "documents": _DOCUMENTS, "texts": _DOCUMENTS,
                     "top_n": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
                     "return_text": {"type": "boolean"}, "model": _MODEL_OR_NULL}, ["query"]),
          "oneOf": [{"required": ["documents"]}, {"required": ["texts"]}]}
"""llama-server's /rerank (hydrad.wire.rerank.parse): Jina's documents or TEI's texts."""

_BOTH: dict[str, type[BaseModel] | dict[str, Any]] = {
    **REQUEST_MODELS, "/infill": InfillRequest, "/v1/messages": MessagesRequest,
    "/v1/embeddings": OPENAI_EMBEDDINGS, "/embeddings": NATIVE_EMBEDDING, "/embedding": NATIVE_EMBEDDING,
    **{path: RERANK for path in rerank.PATHS},
}
LORA_ADAPTERS = {"type": "array", "maxItems": MAX_LORA_ENTRIES, "items": {
    "type": "object", "required": ["id"], "properties": {"id": _ID, "scale": {"type": "number", "minimum": -1000,
                                                                              "maximum": 1000}}}}
"""POST /lora-adapters (llama-server's): the scales by adapter id."""
ENGINE_BODIES: dict[str, type[BaseModel] | dict[str, Any]] = {**_BOTH, **_forwarded(model=False),
                                                               "/lora-adapters": LORA_ADAPTERS}
FRONT_DOOR_BODIES: dict[str, type[BaseModel] | dict[str, Any]] = {**_BOTH, **_forwarded(model=True)}
BINARY_BODIES = frozenset({"/slots/{slot}/state"})
"""Doors whose body is raw bytes (the KV state upload)."""

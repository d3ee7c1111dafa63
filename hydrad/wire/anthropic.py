"""Anthropic's Messages API (``POST /v1/messages``): its requests, read as chat completions.

Clients written for Anthropic's API (and for llama-server, which serves it too) send a request
that :func:`parse` turns into the very :class:`GenRequest` the equivalent chat completion makes:
the system prompt as a first system message, each turn's text, ``max_tokens``, the stop
sequences, the sampling fields, and tools, calls and their results
(:mod:`hydrad.wire.anthropic_tools`). Both doors parse here; the answer, in Anthropic's shapes,
is built from the request's events by :mod:`hydrad.wire.render.anthropic` on either door.
Nothing here does I/O.

Extended thinking (``thinking``) is read as a chat's reasoning format and budget
(:mod:`hydrad.wire.reasoning`); earlier turns' ``thinking`` blocks are accepted and left out of the
prompt, as the chat templates of thinking models leave out earlier reasoning.

User ``image`` blocks with a base64 source are taken (hydrad.wire.images bounds them), for an engine
with a vision projector. What the engine cannot honour (server tools, URL images, documents, ...) is refused
with a 400 naming the field, and so is any field Anthropic does not define (Anthropic refuses
those too): a client never gets an answer that silently ignored what it asked for. A final
assistant turn, which Anthropic continues as a prefill, is refused as well: the chat template
would open a new turn after it instead.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hydrad.common.params import validation_message
from hydrad.wire import anthropic_tools
from hydrad.wire import images as img
from hydrad.common.paramcontract import request_reason
from hydrad.wire.openai import (
    INT32_MAX, MAX_MODEL_NAME, ApiError, check_stops, images_bounded, json_object, unsupported,
)
from hydrad.wire.tools import MAX_CALLS
from hydrad.wire.requests import MAX_STOP_CHARS, GenRequest, SamplingOverrides

# Defined by Anthropic, not served here: refused by name unless absent or set to a value that asks
# for nothing. ``service_tier`` only picks capacity, which a self-hosted engine does not sell.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "mcp_servers": (None, []), "container": (None,), "context_management": (None,), "output_format": (None,),
    "output_config": (None,), "service_tier": (None, "auto", "standard_only"),
}
_BLOCK_FIELDS = {"type", "text", "cache_control", "citations"}
SESSION_FIELD = "session_id"
"""Hydra's own field: the front door's session id (as on chat completions); engines ignore it."""

# For /openapi.json: what _messages and _text check by hand, and no more.
_TEXT_BLOCKS = {"type": "array", "items": {
    "type": "object", "required": ["type", "text"], "additionalProperties": False,
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}, "cache_control": {"type": ["object", "null"]},
                   "citations": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}}}}
_MESSAGES_SCHEMA = {"minItems": 1, "items": {
    "type": "object", "required": ["role", "content"], "additionalProperties": False,
    "properties": {"role": {"enum": ["user", "assistant"]},
                   "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
                       "type": "object", "required": ["type"]}}]}}}}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = Field(None, min_length=1, max_length=MAX_MODEL_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    system: Any = Field(None, json_schema_extra={"anyOf": [{"type": "string"}, {"type": "null"}, _TEXT_BLOCKS]})
    """A string or text blocks: checked by _text, which names the block at fault."""
    messages: list[dict[str, Any]] = Field(json_schema_extra=_MESSAGES_SCHEMA)
    stop_sequences: list[str] | None = Field(None, json_schema_extra={"anyOf": [
        {"type": "array", "items": {"type": "string", "maxLength": MAX_STOP_CHARS}}, {"type": "null"}]})
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    tools: Any = None  # checked by anthropic_tools.spec, which names the tool at fault
    tool_choice: Any = None
    session_id: Any = None
    thinking: Any = Field(None, json_schema_extra={"anyOf": [{"type": "null"}, {
        "type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["enabled", "disabled"]}, "budget_tokens": {"type": "integer", "minimum": 1}}}]})
    """Extended thinking: checked by :func:`_thinking`, which names the part at fault."""
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # see hydrad.common.tenants

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stops([s for s in v or [] if s])
        return v

    def stops(self) -> list[str]:
        return [s for s in self.stop_sequences or [] if s]


def _refuse_extra(req: MessagesRequest) -> None:
    extra = req.model_extra or {}
    unknown = sorted(k for k in extra if k not in _UNSUPPORTED)
    refused = [k for k in unknown if request_reason(k)]  # a parameter the contract refuses: say why
    if refused:
        raise unsupported(refused)
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", "unsupported_field", unknown[0])
    bad = [k for k, neutral in _UNSUPPORTED.items() if k in extra and extra[k] not in neutral]
    if bad:
        raise ApiError(400, f"unsupported field(s) for this engine: {', '.join(bad)}", "unsupported_field", bad[0])


def _thinking(req: MessagesRequest) -> tuple[str | None, int | None]:
    """The chat's reasoning format and budget for the request's ``thinking``: enabled, the model's
    thinking comes back as ``thinking`` blocks within ``budget_tokens`` (fewer than ``max_tokens``,
    as Anthropic requires); disabled, the template is rendered with thinking off (a budget of 0);
    absent, the engine's defaults (and no thinking blocks)."""
    t = req.thinking
    if t is None:
        return None, None
    if not isinstance(t, dict) or t.get("type") not in ("enabled", "disabled"):
        raise ApiError(400, 'thinking must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}',
                       "invalid_field", "thinking.type")
    extra = sorted(set(t) - {"type", "budget_tokens"})
    if extra:
        raise ApiError(400, f"thinking: unknown field(s) {', '.join(extra)}", "unsupported_field",
                       f"thinking.{extra[0]}")
    if t["type"] == "disabled":
        if "budget_tokens" in t:
            raise ApiError(400, "thinking.budget_tokens goes with type enabled", "invalid_field",
                           "thinking.budget_tokens")
        return None, 0
    budget = t.get("budget_tokens")
    if type(budget) is not int or not 1 <= budget < req.max_tokens:
        raise ApiError(400, f"thinking.budget_tokens must be an integer from 1 to less than max_tokens "
                       f"({req.max_tokens})", "invalid_field", "thinking.budget_tokens")
    return "deepseek", budget


def thinks(req: MessagesRequest) -> bool:
    """Whether the answer has ``thinking`` blocks: the request enabled thinking."""
    return isinstance(req.thinking, dict) and req.thinking.get("type") == "enabled"


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of text blocks; any other block is refused naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of text blocks", "invalid_field", where)
    return "".join(_text_block(block, f"{where}[{j}]") for j, block in enumerate(content))


def _block_type(block: Any, at: str) -> Any:
    if not isinstance(block, dict):
        raise ApiError(400, f"{at} must be a content block object", "invalid_field", at)
    return block.get("type")


def _text_block(block: Any, at: str) -> str:
    kind = _block_type(block, at)
    if kind != "text":
        shown = kind if isinstance(kind, str) and len(kind) <= 64 else "?"
        raise ApiError(400, f"{at}: only text blocks are supported here (got type '{shown}')", "unsupported_content",
                       f"{at}.type")
    extra = sorted(set(block) - _BLOCK_FIELDS)
    if extra:
        raise ApiError(400, f"{at}: unknown field(s) {', '.join(extra)}", "unsupported_field", f"{at}.{extra[0]}")
    if not isinstance(block.get("text"), str):
        raise ApiError(400, f"{at}.text must be a string", "invalid_field", f"{at}.text")
    if block.get("citations") not in (None, []):
        raise ApiError(400, f"{at}.citations: citations are not supported", "unsupported_field",
                       f"{at}.citations")
    if not isinstance(block.get("cache_control"), (dict, type(None))):
        raise ApiError(400, f"{at}.cache_control must be an object", "invalid_field", f"{at}.cache_control")
    return block["text"]  # cache_control is a hint: the engine reuses prefixes by itself


def _turn(role: str, content: Any, where: str, names: dict[str, str],
          images: list[bytes]) -> list[dict[str, str]]:
    """One Anthropic message as chat messages: an assistant's text and ``tool_use`` blocks make one
    message with ``tool_calls``; a user's ``tool_result`` blocks each a ``tool`` message, in order
    with the text around them; a user's ``image`` block (base64 source) the image marker in its text,
    its bytes appended to ``images``. ``names`` collects the calls' ids (a result names its call)."""
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content, where)}]
    out: list[dict[str, str]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "tool_use" and role == "assistant":
            call = anthropic_tools.tool_use(block, at)
            names[call["id"]] = call["function"]["name"]
            calls.append(call)
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an earlier turn's thinking, sent back as Anthropic asks: templates leave it out
        elif kind == "tool_result" and role == "user":
            if text:
                out.append({"role": role, "content": "".join(text)})
                text = []
            out.append(anthropic_tools.tool_result(block, at, names, _text))
        elif kind == "image" and role == "user":
            try:
                img.count_ok(len(images) + 1, at)
                images.append(img.anthropic_block(block, at))
            except img.ImageRefused as exc:
                raise ApiError(exc.status, str(exc), exc.code, exc.param) from None
            text.append(img.MARKER)
        else:
            text.append(_text_block(block, at))
    if len(calls) > MAX_CALLS:
        raise ApiError(400, f"{where}: at most {MAX_CALLS} tool_use blocks", "invalid_field", where)
    if calls:
        out.append({"role": role, "content": "".join(text), "tool_calls": json.dumps(calls, ensure_ascii=False)})
    elif text or not out:
        out.append({"role": role, "content": "".join(text)})
    return out


def _messages(req: MessagesRequest, images: list[bytes]) -> list[dict[str, str]]:
    """The chat messages of the request, system prompt first, as the chat path carries them (its images
    appended to ``images``)."""
    if not req.messages:
        raise ApiError(400, "messages must not be empty", "invalid_field", "messages")
    out: list[dict[str, str]] = []
    if req.system is not None:
        system = _text(req.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for i, m in enumerate(req.messages):
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}].role must be user or assistant", "invalid_field", f"messages[{i}].role")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ApiError(400, f"messages[{i}]: unknown field(s) {', '.join(extra)}", "unsupported_field",
                           f"messages[{i}].{extra[0]}")
        if "content" not in m:
            raise ApiError(400, f"messages[{i}].content is required", "invalid_field", f"messages[{i}].content")
        out.extend(_turn(role, m["content"], f"messages[{i}].content", names, images))
    if out[-1]["role"] == "assistant":
        raise ApiError(400, "the last message must be the user's: continuing an assistant turn (prefill) is not "
                       "supported", "unsupported_field", f"messages[{len(req.messages) - 1}]")
    return out


def parse(raw: bytes) -> tuple[MessagesRequest, GenRequest]:
    """A Messages API body → the request and the GenRequest its equivalent chat completion makes;
    ApiError (400) naming the field for anything malformed or not served."""
    return parse_object(json_object(raw))


def parse_object(data: dict[str, Any]) -> tuple[MessagesRequest, GenRequest]:
    """:func:`parse` of a body already read as JSON."""
    try:
        req = MessagesRequest(**data)
    except ValidationError as exc:
        msg, names = validation_message(exc)
        raise ApiError(400, msg, "invalid_field", names[0] if names else None) from None
    _refuse_extra(req)
    sampling = SamplingOverrides(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
    tools = anthropic_tools.spec(req.tools, req.tool_choice)
    reasoning_format, budget = _thinking(req)
    images: list[bytes] = []
    messages = _messages(req, images)
    gen = GenRequest(messages=messages, images=images_bounded(images, [m["content"] for m in messages], "messages"),
                     tools=tools, max_tokens=req.max_tokens, stop=req.stops(),
                     sampling=sampling, cache_salt=req.cache_salt, reasoning_format=reasoning_format,
                     reasoning_budget=budget)
    return req, gen

"""Anthropic's Messages API (``POST /v1/messages``) as a translation over chat completions.

Clients written for Anthropic's API (and for llama-server, which serves it too) send a request
that :func:`parse` turns into the very :class:`GenRequest` the equivalent chat completion makes:
the system prompt as a first system message, each turn's text, ``max_tokens``, the stop
sequences, the sampling fields, and tools, calls and their results
(:mod:`hydrad.wire.anthropic_tools`). The answer goes back in Anthropic's shapes: a ``message``
object, or its server-sent event sequence (``message_start``, ``content_block_start``, ``ping``,
``content_block_delta``..., ``content_block_stop``, ``message_delta``, ``message_stop``), and
errors as ``{"type": "error", "error": {"type", "message"}}``.

Used by both doors: the engine builds its answer from its own events; the coordinator's front
door serves the request like a chat completion and translates the OpenAI body or chunks it gets
(:func:`from_openai`, :class:`StreamFromOpenAI`). Nothing here does I/O.

What the engine cannot honour (server tools, images and documents, extended thinking, ...) is refused
with a 400 naming the field, and so is any field Anthropic does not define (Anthropic refuses
those too): a client never gets an answer that silently ignored what it asked for. A final
assistant turn, which Anthropic continues as a prefill, is refused as well: the chat template
would open a new turn after it instead.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hydrad.common.params import validation_message
from hydrad.wire import anthropic_tools
from hydrad.wire.openai import INT32_MAX, MAX_MODEL_NAME, ApiError, check_stops, json_object
from hydrad.wire.toolcalls import ToolCall
from hydrad.wire.tools import MAX_CALLS
from hydrad.wire.requests import MAX_STOP_CHARS, GenRequest, SamplingOverrides

# Defined by Anthropic, not served here: refused by name unless absent or set to a value that asks
# for nothing. ``service_tier`` only picks capacity, which a self-hosted engine does not sell.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "thinking": (None, {"type": "disabled"}),
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
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", "unsupported_field", unknown[0])
    bad = [k for k, neutral in _UNSUPPORTED.items() if k in extra and extra[k] not in neutral]
    if bad:
        raise ApiError(400, f"unsupported field(s) for this engine: {', '.join(bad)}", "unsupported_field", bad[0])


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


def _turn(role: str, content: Any, where: str, names: dict[str, str]) -> list[dict[str, str]]:
    """One Anthropic message as chat messages: an assistant's text and ``tool_use`` blocks make one
    message with ``tool_calls``; a user's ``tool_result`` blocks each a ``tool`` message, in order
    with the text around them. ``names`` collects the calls' ids (a result names its call)."""
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
        elif kind == "tool_result" and role == "user":
            if text:
                out.append({"role": role, "content": "".join(text)})
                text = []
            out.append(anthropic_tools.tool_result(block, at, names, _text))
        else:
            text.append(_text_block(block, at))
    if len(calls) > MAX_CALLS:
        raise ApiError(400, f"{where}: at most {MAX_CALLS} tool_use blocks", "invalid_field", where)
    if calls:
        out.append({"role": role, "content": "".join(text), "tool_calls": json.dumps(calls, ensure_ascii=False)})
    elif text or not out:
        out.append({"role": role, "content": "".join(text)})
    return out


def _messages(req: MessagesRequest) -> list[dict[str, str]]:
    """The chat messages of the request, system prompt first, as the chat path carries them."""
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
        out.extend(_turn(role, m["content"], f"messages[{i}].content", names))
    if out[-1]["role"] == "assistant":
        raise ApiError(400, "the last message must be the user's: continuing an assistant turn (prefill) is not "
                       "supported", "unsupported_field", f"messages[{len(req.messages) - 1}]")
    return out


def parse(raw: bytes) -> tuple[MessagesRequest, GenRequest]:
    """A Messages API body → the request and the GenRequest its equivalent chat completion makes;
    ApiError (400) naming the field for anything malformed or not served."""
    data = json_object(raw)
    try:
        req = MessagesRequest(**data)
    except ValidationError as exc:
        msg, names = validation_message(exc)
        raise ApiError(400, msg, "invalid_field", names[0] if names else None) from None
    _refuse_extra(req)
    sampling = SamplingOverrides(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
    tools = anthropic_tools.spec(req.tools, req.tool_choice)
    gen = GenRequest(messages=_messages(req), tools=tools, max_tokens=req.max_tokens, stop=req.stops(),
                     sampling=sampling)
    return req, gen


# ---- answers -------------------------------------------------------------------------------------

def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(finish_reason: str | None, stop_word: str | None) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for the engine's finish reason and the stop
    string that ended the generation, if one did."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls":
        return "tool_use", None
    if stop_word:
        return "stop_sequence", stop_word
    return "end_turn", None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic counts the prompt tokens read from the cache apart from the ones it computed."""
    return {"input_tokens": max(prompt_tokens - cached_tokens, 0), "output_tokens": completion_tokens,
            "cache_read_input_tokens": cached_tokens}


def message(rid: str, model: str, text: str, finish_reason: str | None, stop_word: str | None,
            counts: dict[str, int], calls: list[ToolCall] | None = None) -> dict[str, Any]:
    reason, sequence = stop_reason(finish_reason, stop_word)
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": anthropic_tools.content(text, calls or []), "stop_reason": reason, "stop_sequence": sequence,
            "usage": counts}


def event(name: str, data: dict[str, Any]) -> bytes:
    return (f"event: {name}\ndata: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n\n").encode()


class Stream:
    """The events of one streamed answer, block by block. :meth:`start` opens the message (its
    totals come with ``message_delta``: the prompt's token count is known only at the end);
    :meth:`text` and :meth:`calls` add to it, each opening a block of its kind after closing the
    one before (text in one ``text`` block, each call a ``tool_use`` block with its input as one
    ``input_json_delta``); :meth:`end` closes it.

    Without tools the one text block opens at once, as it always did; with tools the first block
    waits for the first text or call, since an answer may be calls only."""

    def __init__(self, rid: str, model: str, tools: bool = False) -> None:
        self.rid, self.model, self.tools = rid, model, tools
        self.index = -1  # the last block opened
        self.open: str | None = None  # the type of the block open now

    def start(self) -> bytes:
        head = {"id": self.rid, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage(0, 0, 0)}
        out = event("message_start", {"type": "message_start", "message": head})
        if not self.tools:
            out += self._open({"type": "text", "text": ""})
        return out + event("ping", {"type": "ping"})

    def _open(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        return out + event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                   "content_block": block})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b"" if self.open == "text" else self._open({"type": "text", "text": ""})
        return out + self._delta({"type": "text_delta", "text": text})

    def calls(self, calls: list[ToolCall]) -> bytes:
        if not calls:
            return b""
        out = b""
        for call in calls:
            out += self._open({**anthropic_tools.block(call), "input": {}})
            out += self._delta({"type": "input_json_delta", "partial_json": json.dumps(
                anthropic_tools.input_of(call), ensure_ascii=False)})
        return out + self._close()

    def end(self, finish_reason: str | None, stop_word: str | None, counts: dict[str, int]) -> bytes:
        reason, sequence = stop_reason(finish_reason, stop_word)
        out = self._open({"type": "text", "text": ""}) if self.index < 0 else b""
        return (out + self._close()
                + event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason,
                                                                             "stop_sequence": sequence},
                                          "usage": counts})
                + event("message_stop", {"type": "message_stop"}))


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_of(exc: ApiError) -> dict[str, Any]:
    return error_body(exc.status, exc.message)


def stream_error(status: int, message: str) -> bytes:
    """A failure after the stream began: Anthropic's ``error`` event, which ends the stream."""
    return event("error", error_body(status, message))


# ---- the front door's adapters: an OpenAI chat answer in Anthropic's shapes ---------------------------

def _counts(openai_usage: dict[str, Any] | None) -> dict[str, int]:
    u = openai_usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return usage(u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0, cached)


def _calls(entries: list[dict[str, Any]]) -> list[ToolCall]:
    """``message.tool_calls`` of an OpenAI answer as the calls it names."""
    return [ToolCall(c.get("id") or "", c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in entries]


def from_openai(body: dict[str, Any], rid: str, stop_word: str | None) -> dict[str, Any]:
    """A chat completion body as the Messages API's answer."""
    choice = body["choices"][0]
    msg = choice["message"]
    return message(rid, body.get("model", ""), msg.get("content") or "", choice.get("finish_reason"),
                   stop_word, _counts(body.get("usage")), _calls(msg.get("tool_calls") or []))


class StreamFromOpenAI:
    """Chat completion chunks (``data:`` events) in, Messages API events out. :meth:`feed` takes what
    the chat stream yields; :meth:`close` ends the message once that stream is over, when the stop
    string that ended it (if any) is known. ``tools``: whether the request offered tools (the
    stream's blocks then open as they come: :class:`Stream`). A call's ``delta.tool_calls``
    entries (its id and name, then its arguments) are gathered and go out as one ``tool_use``
    block before the next text or the end."""

    def __init__(self, rid: str, model: str, tools: bool = False) -> None:
        self.rid, self.model, self.tools = rid, model, tools
        self.out: Stream | None = None
        self.finish: str | None = None
        self.counts = usage(0, 0, 0)
        self.failed = False
        self.pending: dict[int, dict[str, str]] = {}

    def _start(self) -> bytes:
        self.out = Stream(self.rid, self.model, self.tools)
        return self.out.start()

    def _flush(self) -> bytes:
        calls = [ToolCall(c["id"], c["name"], c["arguments"] or "{}") for _, c in sorted(self.pending.items())]
        self.pending = {}
        return self.out.calls(calls) if calls and self.out is not None else b""

    def _gather(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            fn = entry.get("function") or {}
            call = self.pending.setdefault(entry.get("index", 0), {"id": "", "name": "", "arguments": ""})
            call["id"] = entry.get("id") or call["id"]
            call["name"] = fn.get("name") or call["name"]
            call["arguments"] += fn.get("arguments") or ""

    def feed(self, raw: bytes) -> bytes:
        out = b""
        for block in raw.decode("utf-8", "replace").split("\n\n"):
            line = block.strip()
            if not line.startswith("data:") or self.failed:
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                continue
            obj = json.loads(payload)
            if self.out is None:
                self.model = obj.get("model") or self.model
                out += self._start()
            assert self.out is not None
            if "error" in obj:
                err = obj["error"] if isinstance(obj["error"], dict) else {}
                status = 503 if err.get("type") == "unavailable_error" else (
                    400 if err.get("type") == "invalid_request_error" else 500)
                out += stream_error(status, str(err.get("message", "the request failed")))
                self.failed = True
                continue
            if obj.get("usage"):
                self.counts = _counts(obj["usage"])
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    out += self._flush() + self.out.text(delta["content"])
                self._gather(delta.get("tool_calls") or [])
                if choice.get("finish_reason"):
                    out += self._flush()
                    self.finish = choice["finish_reason"]
        return out

    def close(self, stop_word: str | None) -> bytes:
        if self.failed:
            return b""
        out = b"" if self.out is not None else self._start()
        assert self.out is not None
        if self.finish is None:
            return out + stream_error(502, "the stream ended before the message did")
        return out + self._flush() + self.out.end(self.finish, stop_word, self.counts)

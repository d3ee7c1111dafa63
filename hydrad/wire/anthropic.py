"""Anthropic's Messages API (``POST /v1/messages``) as a translation over chat completions.

Clients written for Anthropic's API (and for llama-server, which serves it too) send a request
that :func:`parse` turns into the very :class:`GenRequest` the equivalent chat completion makes:
the system prompt as a first system message, each turn's text, ``max_tokens``, the stop
sequences and the sampling fields. The answer goes back in Anthropic's shapes: a ``message``
object, or its server-sent event sequence (``message_start``, ``content_block_start``, ``ping``,
``content_block_delta``..., ``content_block_stop``, ``message_delta``, ``message_stop``), and
errors as ``{"type": "error", "error": {"type", "message"}}``.

Used by both doors: the engine builds its answer from its own events; the coordinator's front
door serves the request like a chat completion and translates the OpenAI body or chunks it gets
(:func:`from_openai`, :class:`StreamFromOpenAI`). Nothing here does I/O.

What the engine cannot honour (tools, images and documents, extended thinking, ...) is refused
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
from hydrad.wire.openai import INT32_MAX, MAX_MODEL_NAME, ApiError, check_stops, json_object
from hydrad.wire.requests import GenRequest, SamplingOverrides

# Defined by Anthropic, not served here: refused by name unless absent or set to a value that asks
# for nothing. ``service_tier`` only picks capacity, which a self-hosted engine does not sell.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tools": (None, []), "tool_choice": (None, {"type": "none"}), "thinking": (None, {"type": "disabled"}),
    "mcp_servers": (None, []), "container": (None,), "context_management": (None,), "output_format": (None,),
    "output_config": (None,), "service_tier": (None, "auto", "standard_only"),
}
_BLOCK_FIELDS = {"type", "text", "cache_control", "citations"}
SESSION_FIELD = "session_id"
"""Hydra's own field: the front door's session id (as on chat completions); engines ignore it."""


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = Field(None, min_length=1, max_length=MAX_MODEL_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    system: Any = None  # a string or text blocks: checked by _text, which names the block at fault
    messages: list[dict[str, Any]]
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    stream: bool = False
    metadata: dict[str, Any] | None = None
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
    parts = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(block, dict):
            raise ApiError(400, f"{at} must be a content block object", "invalid_field", at)
        kind = block.get("type")
        if kind != "text":
            shown = kind if isinstance(kind, str) and len(kind) <= 64 else "?"
            raise ApiError(400, f"{at}: only text blocks are supported (got type '{shown}')", "unsupported_content",
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
        parts.append(block["text"])  # cache_control is a hint: the engine reuses prefixes by itself
    return "".join(parts)


def _messages(req: MessagesRequest) -> list[dict[str, str]]:
    """The chat messages of the request, system prompt first, as the chat path carries them."""
    if not req.messages:
        raise ApiError(400, "messages must not be empty", "invalid_field", "messages")
    out: list[dict[str, str]] = []
    if req.system is not None:
        system = _text(req.system, "system")
        if system:
            out.append({"role": "system", "content": system})
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
        out.append({"role": role, "content": _text(m["content"], f"messages[{i}].content")})
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
    gen = GenRequest(messages=_messages(req), max_tokens=req.max_tokens, stop=req.stops(), sampling=sampling)
    return req, gen


# ---- answers -------------------------------------------------------------------------------------

def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(finish_reason: str | None, stop_word: str | None) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for the engine's finish reason and the stop
    string that ended the generation, if one did."""
    if finish_reason == "length":
        return "max_tokens", None
    if stop_word:
        return "stop_sequence", stop_word
    return "end_turn", None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic counts the prompt tokens read from the cache apart from the ones it computed."""
    return {"input_tokens": max(prompt_tokens - cached_tokens, 0), "output_tokens": completion_tokens,
            "cache_read_input_tokens": cached_tokens}


def message(rid: str, model: str, text: str, finish_reason: str | None, stop_word: str | None,
            counts: dict[str, int]) -> dict[str, Any]:
    reason, sequence = stop_reason(finish_reason, stop_word)
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": reason, "stop_sequence": sequence,
            "usage": counts}


def event(name: str, data: dict[str, Any]) -> bytes:
    return (f"event: {name}\ndata: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n\n").encode()


def stream_start(rid: str, model: str) -> bytes:
    """The events before the first text: the message (its totals come with ``message_delta``: the
    prompt's token count is known only at the end), its one text block, a ping."""
    head = {"id": rid, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage(0, 0, 0)}
    return (event("message_start", {"type": "message_start", "message": head})
            + event("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}})
            + event("ping", {"type": "ping"}))


def text_delta(text: str) -> bytes:
    return event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": text}})


def stream_end(finish_reason: str | None, stop_word: str | None, counts: dict[str, int]) -> bytes:
    reason, sequence = stop_reason(finish_reason, stop_word)
    return (event("content_block_stop", {"type": "content_block_stop", "index": 0})
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


def from_openai(body: dict[str, Any], rid: str, stop_word: str | None) -> dict[str, Any]:
    """A chat completion body as the Messages API's answer."""
    choice = body["choices"][0]
    return message(rid, body.get("model", ""), choice["message"].get("content") or "", choice.get("finish_reason"),
                   stop_word, _counts(body.get("usage")))


class StreamFromOpenAI:
    """Chat completion chunks (``data:`` events) in, Messages API events out. :meth:`feed` takes what
    the chat stream yields; :meth:`close` ends the message once that stream is over, when the stop
    string that ended it (if any) is known."""

    def __init__(self, rid: str, model: str) -> None:
        self.rid, self.model = rid, model
        self.started = False
        self.finish: str | None = None
        self.counts = usage(0, 0, 0)
        self.failed = False

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
            if not self.started:
                self.model = obj.get("model") or self.model
                out += stream_start(self.rid, self.model)
                self.started = True
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
                text = (choice.get("delta") or {}).get("content")
                if text:
                    out += text_delta(text)
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]
        return out

    def close(self, stop_word: str | None) -> bytes:
        if self.failed:
            return b""
        out = b"" if self.started else stream_start(self.rid, self.model)
        if self.finish is None:
            return out + stream_error(502, "the stream ended before the message did")
        return out + stream_end(self.finish, stop_word, self.counts)

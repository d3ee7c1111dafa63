"""Anthropic's Messages answers (``POST /v1/messages``): one ``message`` object, or its stream of
named events (``message_start``, content blocks, ``message_delta``, ``message_stop``), and its
error shapes. A request that enabled extended thinking gets the model's thinking as ``thinking``
blocks ahead of the text and calls."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hydrad.wire import anthropic_tools
from hydrad.wire.events import Done, Token, Usage
from hydrad.wire.openai import ApiError
from hydrad.wire.render.base import Renderer
from hydrad.wire.toolcalls import ToolCall


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


def thinking_block(text: str) -> dict[str, Any]:
    """A ``thinking`` block. Its ``signature`` is empty: Anthropic signs its own models' thinking so
    that it can be checked when sent back; this engine keeps no such secret, and takes earlier
    thinking blocks back without one."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def message(rid: str, model: str, text: str, finish_reason: str | None, stop_word: str | None,
            counts: dict[str, int], calls: list[ToolCall] | None = None, thinking: str = "") -> dict[str, Any]:
    reason, sequence = stop_reason(finish_reason, stop_word)
    blocks = ([thinking_block(thinking)] if thinking else []) + anthropic_tools.content(text, calls or [])
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": reason, "stop_sequence": sequence, "usage": counts}


def event(name: str, data: dict[str, Any]) -> bytes:
    return (f"event: {name}\ndata: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n\n").encode()


class Stream:
    """The events of one streamed answer, block by block. :meth:`start` opens the message (its
    totals come with ``message_delta``: the prompt's token count is known only at the end);
    :meth:`thinking`, :meth:`text` and :meth:`calls` add to it, each opening a block of its kind
    after closing the one before (thinking in a ``thinking`` block of ``thinking_delta``s, text in
    one ``text`` block, each call a ``tool_use`` block with its input as one ``input_json_delta``);
    :meth:`end` closes it.

    Without tools or thinking the one text block opens at once, as it always did; with either the
    first block waits for the first piece, since an answer may begin with thinking or be calls only."""

    def __init__(self, rid: str, model: str, tools: bool = False) -> None:
        self.rid, self.model, self.tools = rid, model, tools
        self.index = -1  # the last block opened
        self.open: str | None = None  # the type of the block open now

    def start(self) -> bytes:
        head: dict[str, Any] = {"id": self.rid, "type": "message", "role": "assistant", "model": self.model, "content": [],
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

    def thinking(self, text: str) -> bytes:
        if not text:
            return b""
        out = b"" if self.open == "thinking" else self._open({"type": "thinking", "thinking": "", "signature": ""})
        return out + self._delta({"type": "thinking_delta", "thinking": text})

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


def counts(u: Usage) -> dict[str, int]:
    return usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


class MessagesAnswer(Renderer):
    """``thinking``: the request enabled extended thinking, and the model's thinking is answered in
    ``thinking`` blocks (a request that did not enable it gets none)."""

    dialect = "anthropic.messages"

    def __init__(self, model: str, *, tools: bool = False, thinking: bool = False, rid: str | None = None) -> None:
        self.rid = rid or new_id()
        self.model = model
        self.thinks = thinking
        self.stream = Stream(self.rid, model, tools or thinking)

    def head(self) -> bytes:
        return self.stream.start()

    def piece(self, ev: Token) -> bytes:
        thought = self.stream.thinking(ev.reasoning) if self.thinks else b""
        return thought + self.stream.text(ev.text) + self.stream.calls(list(ev.calls))

    def end(self, done: Done, extra: dict[str, Any]) -> bytes:
        return self.stream.end(done.finish_reason, done.stop_word, counts(done.usage))

    def broken(self, err: ApiError) -> bytes:
        return stream_error(err.status, err.message)

    def whole(self, pieces: list[Token], done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        return message(self.rid, self.model, "".join(t.text for t in pieces), done.finish_reason, done.stop_word,
                       counts(done.usage), [c for t in pieces for c in t.calls],
                       "".join(t.reasoning for t in pieces) if self.thinks else "")

    @staticmethod
    def refusal(err: ApiError) -> dict[str, Any]:
        return error_of(err)

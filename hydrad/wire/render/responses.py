"""OpenAI's Responses API answers (``POST /v1/responses``): one ``response`` object, or its stream of
typed events, each ``event: TYPE`` and ``data: {"type": TYPE, "sequence_number": N, ...}``.

The output is a list of items in the order the model made them: a ``reasoning`` item for a thinking
model's thinking (split off as chat's ``reasoning_content`` is), one ``message`` item with one
``output_text`` part for the text, and a ``function_call`` item per tool call. A stream opens each
item (``response.output_item.added``), sends its deltas (``response.reasoning_text.delta``,
``response.output_text.delta``, ``response.function_call_arguments.delta``) and closes it
(``...done``, ``response.output_item.done``) before the next one opens; it begins with
``response.created`` and ``response.in_progress`` and ends with ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` ended it) carrying the whole response, whose
``output`` equals the whole answer's. A failure after the stream began is an ``error`` event.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from hydrad.wire.events import Done, Token, Usage
from hydrad.wire.openai import ApiError
from hydrad.wire.render.base import Renderer
from hydrad.wire.toolcalls import ToolCall


def new_id() -> str:
    return "resp_" + uuid.uuid4().hex[:24]


def _item_id(prefix: str) -> str:
    return f"{prefix}_" + uuid.uuid4().hex[:24]


def usage(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _call(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


class ResponsesAnswer(Renderer):
    """``echo``: the request's settings a response repeats (:meth:`hydrad.wire.responses.Responses.echo`)."""

    dialect = "openai.responses"

    def __init__(self, model: str, echo: dict[str, Any] | None = None, *, rid: str | None = None) -> None:
        self.rid = rid or new_id()
        self.model = model
        self.echo = echo or {}
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # the items closed so far (a stream's)
        self.open: dict[str, Any] | None = None  # the item open now, with its text so far

    # ----- the response object ----------------------------------------------------------------

    def response(self, status: str, output: list[dict[str, Any]], u: Usage | None = None,
                 finish: str | None = None) -> dict[str, Any]:
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "usage": usage(u) if u is not None else None,
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
                **self.echo}

    @staticmethod
    def _status(done: Done) -> str:
        return "incomplete" if done.finish_reason == "length" else "completed"

    def whole(self, pieces: list[Token], done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        thinking = "".join(t.reasoning for t in pieces)
        if thinking:
            output.append(_reasoning(_item_id("rs"), thinking))
        text = "".join(t.text for t in pieces)
        calls = [c for t in pieces for c in t.calls]
        if text.strip() or not calls:
            output.append(_message(_item_id("msg"), text))
        output += [_call(_item_id("fc"), c) for c in calls]
        return self.response(self._status(done), output, done.usage, done.finish_reason)

    # ----- the stream --------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return (f"event: {kind}\ndata: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False)
                + "\n\n").encode()

    def head(self) -> bytes:
        start = self.response("in_progress", [])
        return self._event("response.created", response=start) + self._event("response.in_progress", response=start)

    def _open(self, kind: str) -> bytes:
        out = self._close()
        index = len(self.output)
        if kind == "message":
            item = _message(_item_id("msg"), "", "in_progress")
            item["content"] = []
            self.open = {"kind": kind, "item": item, "text": ""}
            return (out + self._event("response.output_item.added", output_index=index, item=item)
                    + self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        item = {"type": "reasoning", "id": _item_id("rs"), "summary": [], "content": []}
        self.open = {"kind": kind, "item": item, "text": ""}
        return out + self._event("response.output_item.added", output_index=index, item=item)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        kind, item, text = self.open["kind"], self.open["item"], self.open["text"]
        self.open = None
        index = len(self.output)
        if kind == "message":
            done = _message(item["id"], text)
            part = done["content"][0]
            out = (self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                               text=text, logprobs=[])
                   + self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                 content_index=0, part=part))
        else:
            done = _reasoning(item["id"], text)
            out = self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text)
        self.output.append(done)
        return out + self._event("response.output_item.done", output_index=index, item=done)

    def _text(self, kind: str, text: str) -> bytes:
        if not text:
            return b""
        out = b"" if self.open is not None and self.open["kind"] == kind else self._open(kind)
        assert self.open is not None
        self.open["text"] += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return out + self._event(name, item_id=self.open["item"]["id"], output_index=len(self.output),
                                 content_index=0, delta=text, **extra)

    def _calls(self, calls: list[ToolCall]) -> bytes:
        out = self._close() if calls else b""
        for call in calls:
            index = len(self.output)
            item_id = _item_id("fc")
            out += self._event("response.output_item.added", output_index=index,
                               item={**_call(item_id, call, "in_progress"), "arguments": ""})
            out += self._event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                               delta=call.arguments)
            out += self._event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                               name=call.name, arguments=call.arguments)
            done = _call(item_id, call)
            self.output.append(done)
            out += self._event("response.output_item.done", output_index=index, item=done)
        return out

    def piece(self, ev: Token) -> bytes:
        return self._text("reasoning", ev.reasoning) + self._text("message", ev.text) + self._calls(list(ev.calls))

    def end(self, done: Done, extra: dict[str, Any]) -> bytes:
        out = b"" if self.output or self.open is not None else self._open("message")  # an empty answer: one message
        out += self._close()
        status = self._status(done)
        final = self.response(status, self.output, done.usage, done.finish_reason)
        return out + self._event(f"response.{status}", response=final)

    def broken(self, err: ApiError) -> bytes:
        return self._event("error", code=err.code, message=err.message, param=err.param)

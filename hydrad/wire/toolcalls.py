"""OpenAI tool calls, the answer side: a model's text in one of :mod:`hydrad.wire.toolformats`'
formats read into its content and its calls, whole or as it streams.

The engine reads its own output with :class:`ToolStream` (so both doors and the bus carry calls,
never the format's text); each call goes out once it is complete, with its arguments as JSON
text, and the doors put it in OpenAI's shapes (:func:`delta` for a stream). Text that does not
parse as a call (a cut-off answer, a model ignoring the format) is content, as llama-server
returns it: nothing the model wrote is dropped.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from hydrad.wire.reasoning import partial_suffix
from hydrad.wire.toolformats import HERMES_CLOSE, HERMES_OPEN, Format


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: an id made for it, the function's name, the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        """The call as ``message.tool_calls[]`` holds it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def delta(calls: list[ToolCall], first_index: int) -> list[dict[str, Any]]:
    """Stream entries for complete calls, as OpenAI streams a call: an entry with its index, id,
    type, name and empty arguments, then one with its arguments."""
    out: list[dict[str, Any]] = []
    for i, call in enumerate(calls, first_index):
        out.append({"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}})
        out.append({"index": i, "function": {"arguments": call.arguments}})
    return out


def _call(obj: Any) -> ToolCall | None:
    """``{"name": str, "arguments": object or JSON text}`` as a call; None for anything else."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        text = args
    else:
        text = json.dumps(args, ensure_ascii=False)
    return ToolCall(new_call_id(), obj["name"], text)


def parse_generic(text: str) -> tuple[str, list[ToolCall]]:
    """A generic-format answer: ``{"tool_call": ...}``, ``{"tool_calls": [...]}`` or
    ``{"response": "..."}``; anything else is content as written."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(obj, dict):
        if "tool_call" in obj:
            call = _call(obj["tool_call"])
            if call is not None:
                return "", [call]
        elif isinstance(obj.get("tool_calls"), list):
            calls = [_call(c) for c in obj["tool_calls"]]
            if calls and all(c is not None for c in calls):
                return "", [c for c in calls if c is not None]
        elif isinstance(obj.get("response"), str):
            return obj["response"], []
    return text, []


def _hermes_block(body: str) -> ToolCall | None:
    try:
        return _call(json.loads(body))
    except ValueError:
        return None


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """A Hermes-format answer: ``<tool_call>{...}</tool_call>`` blocks among content."""
    stream = ToolStream("hermes")
    content, calls = stream.feed(text)
    more, rest = stream.finish()
    return content + more, calls + rest


def parse(fmt: Format, text: str) -> tuple[str, list[ToolCall]]:
    return parse_hermes(text) if fmt == "hermes" else parse_generic(text)


class ToolStream:
    """Reads an answer as it is generated: :meth:`feed` each piece of text, :meth:`finish` at the
    end; each returns the content that is now certain and the calls now complete.

    Hermes content streams as it comes, held back only while it could be the start of
    ``<tool_call>``; a call goes out at its closing tag. A generic answer is one JSON object whose
    meaning is known only at its end, so it is all held back until :meth:`finish`."""

    def __init__(self, fmt: Format) -> None:
        self.fmt = fmt
        self.buf = ""
        self.in_call = False
        self.n_calls = 0
        self.blank = ""  # blank content held back (see _content)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buf += text
        if self.fmt == "generic":
            return "", []
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self.in_call:
                end = self.buf.find(HERMES_CLOSE)
                if end < 0:
                    break
                body, self.buf = self.buf[:end], self.buf[end + len(HERMES_CLOSE):]
                self.in_call = False
                call = _hermes_block(body)
                if call is None:  # not a call after all: the model's text, as written
                    content.append(HERMES_OPEN + body + HERMES_CLOSE)
                else:
                    calls.append(call)
                continue
            start = self.buf.find(HERMES_OPEN)
            if start >= 0:
                content.append(self.buf[:start])
                self.buf = self.buf[start + len(HERMES_OPEN):]
                self.in_call = True
                continue
            keep = partial_suffix(self.buf, HERMES_OPEN)
            content.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            break
        self.n_calls += len(calls)
        return self._content("".join(content)), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left at the end: an unclosed Hermes call is a call when its JSON is complete
        (a model may stop right after it), else content, like any held-back text."""
        rest, self.buf = self.buf, ""
        if self.fmt == "generic":
            content, calls = parse_generic(rest)
        elif self.in_call:
            call = _hermes_block(rest)
            content, calls = ("", [call]) if call is not None else (HERMES_OPEN + rest, [])
        else:
            content, calls = rest, []
        self.n_calls += len(calls)
        content = self._content(content)
        if not self.n_calls:
            content, self.blank = content + self.blank, ""
        return content, calls

    def _content(self, text: str) -> str:
        """Content to send now. Blank text waits for more: the line breaks a model puts around its
        calls are not content, and are dropped when the answer made calls."""
        text, self.blank = self.blank + text, ""
        if text.strip():
            return text
        self.blank = text
        return ""

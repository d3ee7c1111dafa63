"""OpenAI's Responses API (``POST /v1/responses``) read into the chat completion it stands for.

The body is translated into a Chat Completions body and parsed by :func:`hydrad.wire.openai.parse`,
so a response is generated exactly as that chat completion (same template, tools, grammar, limits)
and only its shape differs (:mod:`hydrad.wire.render.responses`). As llama-server does:

- ``instructions`` become the system message; ``input`` is a string (one user message) or a list
  of items: messages (``role`` user, assistant, system or developer; content a string or
  ``input_text`` / ``output_text`` parts), ``function_call`` items (an assistant turn's calls) and
  ``function_call_output`` items (a tool's result);
- ``max_output_tokens``, ``temperature``, ``top_p``, ``tools`` (function tools), ``tool_choice``,
  ``parallel_tool_calls`` and ``text.format`` (``text``, ``json_object``, ``json_schema``) map to
  their chat fields; ``metadata``, ``user``, ``store`` and ``truncation: "disabled"`` are accepted;
- what needs state or kinds this engine has not (``previous_response_id`` and ``conversation``:
  no response is stored; ``background``; built-in tools; image and file inputs; ``reasoning``
  settings beyond none) is refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

from typing import Any

from hydrad.common import jsonbody
from hydrad.wire import openai
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import GenRequest

MAX_ITEMS = 100_000

_REFUSED = {
    "previous_response_id": "no response is stored here; send the whole conversation in input",
    "conversation": "no conversation is stored here; send the whole conversation in input",
    "background": "responses are answered while the request waits",
    "prompt": "no stored prompt templates",
    "include": "no extra output data (sources, logprobs of built-in tools) is kept",
    "max_tool_calls": "not served",
    "top_logprobs": "not served on /v1/responses; use /v1/chat/completions",
    "service_tier": "one tier",
    "prompt_cache_key": "the engine reuses cached prefixes by itself",
    "safety_identifier": "not served",
}
_PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "seed")


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", "invalid_field", param)


def _text_of(content: Any, where: str, allowed: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed or not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{j}]", f"a part of type {' or '.join(allowed)} with its text (images and files "
                       "are not served)")
        out.append(part["text"])
    return "".join(out)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions", "a string")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("input", "a string or a non-empty list of items")
    if len(items) > MAX_ITEMS:
        raise _bad("input", f"at most {MAX_ITEMS} items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{where}.role", "user, assistant, system or developer")
            parts = ("output_text", "refusal") if role == "assistant" else ("input_text",)
            text = _text_of(item.get("content"), f"{where}.content", parts)
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise _bad(where, "a function_call has a call_id, a name and its arguments (a JSON string)")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.call_id", "the call_id of the function_call it answers")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _text_of(output, f"{where}.output", ("input_text",))})
        elif kind == "reasoning":
            continue  # earlier thinking is not sent back to the model, as in chat completions
        else:
            raise _bad(f"{where}.type", f"'{kind}' items are not served (message, function_call, "
                       "function_call_output and reasoning are)")
    return out


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _bad("tools", "a list")
        converted = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise _bad(f"tools[{i}].type", f"only function tools are served, not {kind!r}")
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            converted.append({"type": "function", "function": fn})
        if converted:
            chat["tools"] = converted
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise _bad("tool_choice", "auto, none, required, or {\"type\": \"function\", \"name\": ...}")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        chat["tool_choice"] = choice


def _format(body: dict[str, Any], chat: dict[str, Any]) -> None:
    text = body.get("text")
    if text is None:
        return
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise _bad("text", "an object with format")
    fmt = text.get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise _bad("text.format", "an object with a type")
    if fmt is None or fmt.get("type") == "text":
        return
    if fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise _bad("text.format.type", "text, json_object or json_schema")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions body a Responses body stands for (ApiError naming the field)."""
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, [], False):
            raise ApiError(400, f"unsupported field(s) for this engine: {name} ({why})", "unsupported_field", name)
    reasoning = body.get("reasoning")
    if reasoning not in (None, {}) and not (isinstance(reasoning, dict) and reasoning.get("effort") in (None, "none")
                                            and not reasoning.get("summary")):
        raise ApiError(400, "unsupported field(s) for this engine: reasoning (a reasoning effort or summary is not "
                       "served; a thinking model's thinking comes as a reasoning item)", "unsupported_field",
                       "reasoning")
    if body.get("truncation") not in (None, "disabled"):
        raise ApiError(400, "unsupported field(s) for this engine: truncation (a context too small for the input "
                       "is an error, as truncation: disabled)", "unsupported_field", "truncation")
    known = {*_REFUSED, *_PASSED, "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
             "metadata", "store", "reasoning", "truncation", "stream_options", "cache_salt", "session_id"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", "unknown_field", unknown[0])
    chat: dict[str, Any] = {k: body[k] for k in (*_PASSED, "cache_salt", "session_id") if k in body}
    chat["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    _tools(body, chat)
    _format(body, chat)
    return chat


def parse(raw: bytes) -> tuple[Any, GenRequest]:
    """A Responses body → (the body as read, the GenRequest of its chat completion)."""
    try:
        body = jsonbody.loads_object(raw, "request body")
    except jsonbody.BodyError as exc:
        raise ApiError(400, str(exc), exc.code, exc.param) from None
    req, greq = openai.parse_object("chat", to_chat(body))
    return Responses(body, req), greq


class Responses:
    """What the answer needs of the request besides its events: the fields a response echoes."""

    def __init__(self, body: dict[str, Any], chat: Any) -> None:
        self.body, self.chat = body, chat
        self.model = chat.model
        self.stream = bool(body.get("stream"))
        self.session_id = body.get("session_id")  # the front door's session field, as on chat
        self.model_extra: dict[str, Any] = {}

    def echo(self) -> dict[str, Any]:
        """The request's settings, as a response object repeats them."""
        b = self.body
        fmt = (b.get("text") or {}).get("format") or {"type": "text"}
        return {"instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
                "metadata": b.get("metadata") or {}, "parallel_tool_calls": b.get("parallel_tool_calls", True),
                "temperature": b.get("temperature", 1.0), "top_p": b.get("top_p", 1.0),
                "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
                "text": {"format": fmt}, "store": False, "truncation": "disabled", "reasoning": b.get("reasoning"),
                "previous_response_id": None, "user": b.get("user")}

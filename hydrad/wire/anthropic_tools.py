"""Tool use on Anthropic's Messages API, as a translation over OpenAI's tool calls.

Anthropic's request fields become the OpenAI ones the chat path already reads, and are checked by
the same code (:mod:`hydrad.wire.tools`), so a Messages request with tools renders the very
prompt and grammar its equivalent chat completion does:

- ``tools: [{name, description?, input_schema}]`` → function tools (``input_schema`` is the
  function's ``parameters``);
- ``tool_choice``: ``auto`` → ``"auto"``, ``any`` → ``"required"``, ``tool`` (+ ``name``) → the
  named function, ``none`` → ``"none"``; ``disable_parallel_tool_use`` → ``parallel_tool_calls``
  negated (Anthropic allows several calls unless told not to);
- an assistant's ``tool_use`` blocks → its ``tool_calls``; a user's ``tool_result`` blocks → ``tool``
  messages (with the called function's name, found in the history).

Answers go back the other way: each call a ``tool_use`` block whose ``input`` is the arguments
object. An error names the field as the client wrote it (``tools[1].input_schema``), not as the
translation spells it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from hydrad.wire import tools as tl
from hydrad.wire.openai import ApiError
from hydrad.wire.toolcalls import ToolCall

_TOOL_FIELDS = {"name", "description", "input_schema", "cache_control", "type"}
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_USE_FIELDS = {"type", "id", "name", "input", "cache_control"}
_RESULT_FIELDS = {"type", "tool_use_id", "content", "is_error", "cache_control"}
ERROR_PREFIX = "Error: "
"""Put before a ``tool_result`` marked ``is_error``: a chat message has no such flag, and the model
should know the call failed."""


def _refuse(message: str, param: str, code: str = "invalid_field") -> ApiError:
    return ApiError(400, f"{param}: {message}", code, param)


def _anthropic_param(param: str) -> str:
    """A path of the OpenAI translation as the client's request spells it."""
    param = re.sub(r"\.function\.parameters", ".input_schema", param)
    param = re.sub(r"\.function\.arguments", ".input", param)
    return re.sub(r"\.function(\.|$)", r"\1", param)


def _tool(tool: Any, where: str) -> dict[str, Any]:
    """One Anthropic tool as an OpenAI function tool; what only Anthropic defines is checked here,
    the rest by :func:`hydrad.wire.tools.check_tools`."""
    if not isinstance(tool, dict):
        raise _refuse("must be an object {name, description?, input_schema}", where)
    if tool.get("type") not in (None, "custom"):
        raise _refuse("only custom tools (name, description, input_schema) are supported, not server tools",
                      f"{where}.type", "unsupported_field")
    extra = sorted(set(tool) - _TOOL_FIELDS)
    if extra:
        raise _refuse(f"unknown field {extra[0][:64]!r}", f"{where}.{extra[0][:64]}")
    if not isinstance(tool.get("cache_control"), (dict, type(None))):
        raise _refuse("must be an object", f"{where}.cache_control")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise _refuse('is required: a JSON schema of type "object"', f"{where}.input_schema")
    fn = {"name": tool.get("name"), "parameters": schema}
    if "description" in tool:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _choice(choice: Any) -> tuple[Any, Any]:
    """``tool_choice`` as OpenAI's ``tool_choice`` and ``parallel_tool_calls``."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict):
        raise _refuse('must be an object {"type": "auto" | "any" | "tool" | "none"}', "tool_choice")
    kind = choice.get("type")
    allowed = {"type"} | ({"name"} if kind == "tool" else set()) | (set() if kind == "none" else
                                                                    {"disable_parallel_tool_use"})
    extra = sorted(set(choice) - allowed)
    if extra:
        raise _refuse(f"unknown field {extra[0][:64]!r}", f"tool_choice.{extra[0][:64]}")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _refuse("must be true or false", "tool_choice.disable_parallel_tool_use")
    parallel = None if kind == "none" else not disable
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _refuse("must be the name of a tool", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    if kind not in _CHOICES:
        raise _refuse('must be "auto", "any", "tool" or "none"', "tool_choice.type")
    return _CHOICES[kind], parallel


def spec(tools: Any, choice: Any) -> tl.ToolSpec | None:
    """The request's tool spec, exactly as :func:`hydrad.wire.tools.parse` makes it for the
    equivalent chat completion (None: no tools, or ``tool_choice`` none); a 400 naming the field."""
    if tools is not None and not isinstance(tools, list):
        raise _refuse("must be a list of tools", "tools")
    if tools is not None and len(tools) > tl.MAX_TOOLS:
        raise _refuse(f"at most {tl.MAX_TOOLS} tools (got {len(tools)})", "tools")
    openai_tools = None if tools is None else [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    openai_choice, parallel = _choice(choice)
    fields = {"tools": openai_tools, "tool_choice": openai_choice,
              "parallel_tool_calls": parallel if openai_tools else None}
    try:
        return tl.parse(fields)
    except tl.ToolError as exc:
        param = "tool_choice.name" if exc.param == "tool_choice" and isinstance(openai_choice, dict) \
            else _anthropic_param(exc.param)
        raise _refuse(str(exc).split(": ", 1)[-1], param) from None


# ---- history -----------------------------------------------------------------------------------

def tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An assistant's ``tool_use`` block as a normalised OpenAI call (:mod:`hydrad.wire.tools`)."""
    extra = sorted(set(block) - _USE_FIELDS)
    if extra:
        raise _refuse(f"unknown field {extra[0][:64]!r}", f"{where}.{extra[0][:64]}")
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise _refuse("must be the call's id (a string)", f"{where}.id")
    if not isinstance(block.get("input"), dict):
        raise _refuse("must be an object (the tool's arguments)", f"{where}.input")
    call = {"id": block["id"], "type": "function", "function": {"name": block.get("name"), "arguments": block["input"]}}
    try:
        fields = tl.message_fields({"tool_calls": [call]}, "assistant", where)
    except tl.ToolError as exc:
        param = _anthropic_param(exc.param.replace(f"{where}.tool_calls[0]", where))
        raise _refuse(str(exc).split(": ", 1)[-1], param) from None
    return tl.calls_of(fields)[0]


def tool_result(block: dict[str, Any], where: str, names: dict[str, str],
                text_of: Callable[[Any, str], str]) -> dict[str, str]:
    """A user's ``tool_result`` block as an OpenAI ``tool`` message; ``names`` maps the history's
    call ids to their functions, ``text_of`` reads the result's text blocks."""
    extra = sorted(set(block) - _RESULT_FIELDS)
    if extra:
        raise _refuse(f"unknown field {extra[0][:64]!r}", f"{where}.{extra[0][:64]}")
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or call_id not in names:
        raise _refuse("must be the id of a tool_use block of an earlier assistant message", f"{where}.tool_use_id")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _refuse("must be true or false", f"{where}.is_error")
    content = block.get("content", "")
    text = "" if content is None else text_of(content, f"{where}.content")
    message = {"role": "tool", "content": (ERROR_PREFIX + text) if is_error else text,
               "tool_call_id": call_id, "name": names[call_id]}
    try:
        tl.message_fields(message, "tool", where)
    except tl.ToolError as exc:
        raise _refuse(str(exc).split(": ", 1)[-1], exc.param.replace(".tool_call_id", ".tool_use_id")) from None
    return message


# ---- answers -----------------------------------------------------------------------------------

def use_id(call: ToolCall) -> str:
    """Anthropic's id of a call (``toolu_...``), made from the engine's; the same at both doors."""
    return "toolu_" + call.id.removeprefix("call_")


def input_of(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as ``input``, an object: arguments that are not one (possible only when
    no grammar held the answer) are kept whole, as text, under ``arguments``."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": call.arguments}


def block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id(call), "name": call.name, "input": input_of(call)}


def content(text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """An answer's content blocks: the text (left out when the answer is only calls), then the calls."""
    if not calls:
        return [{"type": "text", "text": text}]
    head = [{"type": "text", "text": text.strip()}] if text.strip() else []
    return head + [block(c) for c in calls]

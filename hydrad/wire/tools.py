"""OpenAI tool calls, the request side: ``tools``, ``tool_choice`` and ``parallel_tool_calls``
checked into a :class:`ToolSpec`, and the chat messages that carry calls and their results.

Both doors read a request with this module and the bus carries the spec as it is, so the engine
renders exactly what a door accepted. Every shape is checked here with the field's path in the
message (``tools[2].function.name``), within bounds: a tool list is rendered into every prompt of
the request and becomes a grammar, so its size is limited before either happens.

Messages stay ``{str: str}`` on every wire: an assistant message's calls travel as the JSON text
of a normalised list (``tool_calls``), a tool result as its text with ``tool_call_id`` (and
``name``); the engine turns them back into what its chat template reads.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from hydrad.wire.grammar import MAX_SCHEMA_CHARS, GrammarError, check_schema

MAX_TOOLS = 128
"""Most functions a request may offer (OpenAI documents 128)."""

MAX_DESCRIPTION = 8192
"""Longest function description, in characters."""

MAX_CALLS = 64
"""Most calls one assistant message of the history may carry."""

MAX_ARGUMENTS = 65536
"""Longest arguments text of one call in the history, in characters."""

MAX_CALL_ID = 256
"""Longest call id (``tool_calls[].id``, ``tool_call_id``)."""

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for a function name: letters, digits, underscores and dashes, at most 64."""

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
"""What a function without ``parameters`` takes: no arguments (OpenAI's reading)."""


class ToolError(ValueError):
    """A tool field that will not be used; ``param`` is its path in the request."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _finite(value: Any, where: str) -> None:
    """JSON's reader takes NaN and Infinity, which no schema or prompt means anything with."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ToolError("a number that is not finite", where)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _function(tool: Any, where: str) -> dict[str, Any]:
    """One entry of ``tools`` in its normalised form: ``{"type": "function", "function": {"name",
    "description", "parameters"}}`` (description and parameters always present)."""
    if not isinstance(tool, dict):
        raise ToolError('must be an object {"type": "function", "function": {...}}', where)
    if tool.get("type") != "function":
        raise ToolError('only "function" tools are supported', f"{where}.type")
    extra = set(tool) - {"type", "function"}
    if extra:
        raise ToolError(f"unknown field {sorted(extra)[0]!r}", where)
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolError("must be an object with the function's name", f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ToolError("must be 1 to 64 letters, digits, underscores or dashes", f"{where}.function.name")
    description = _short_text(fn, "description", MAX_DESCRIPTION, f"{where}.function.description")
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise ToolError("must be a JSON schema (an object)", f"{where}.function.parameters")
    _finite(parameters, f"{where}.function.parameters")
    if len(json.dumps(parameters, separators=(",", ":"), ensure_ascii=False)) > MAX_SCHEMA_CHARS:
        raise ToolError(f"at most {MAX_SCHEMA_CHARS} characters as JSON", f"{where}.function.parameters")
    if not isinstance(fn.get("strict", False), bool):
        raise ToolError("must be true or false", f"{where}.function.strict")
    extra = set(fn) - {"name", "description", "parameters", "strict"}
    if extra:
        raise ToolError(f"unknown field {sorted(extra)[0]!r}", f"{where}.function")
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` normalised, or ToolError naming the first bad field. Pure shape checks: the bus
    runs them again on what it carries."""
    if not isinstance(tools, list):
        raise ToolError("must be a list of function tools", "tools")
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools (got {len(tools)})", "tools")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        norm = _function(tool, f"tools[{i}]")
        name = norm["function"]["name"]
        if name in seen:
            raise ToolError(f"a second function named {name!r}", f"tools[{i}].function.name")
        seen.add(name)
        out.append(norm)
    return out


@dataclass(frozen=True)
class ToolSpec:
    """The tools a generation may call, as the doors accepted them (and the bus carries them)."""

    tools: Annotated[list[dict[str, Any]], AfterValidator(check_tools)]
    """Normalised ``tools`` (:func:`check_tools`), never empty."""
    choice: Literal["auto", "required"] = "auto"
    """``auto``: the model answers or calls; ``required``: it calls (``tool_choice`` naming a
    function is ``required`` with :attr:`function`)."""
    function: str | None = None
    """The one function the model must call, when ``tool_choice`` names one."""
    parallel: bool = False
    """Whether one answer may hold several calls (``parallel_tool_calls``; llama-server's default
    is false)."""

    def __post_init__(self) -> None:
        if not self.tools:
            raise ToolError("must offer at least one function", "tools")
        if self.function is not None and self.function not in {t["function"]["name"] for t in self.tools}:
            raise ToolError("names no function of tools", "tool_choice")

    def offered(self) -> list[dict[str, Any]]:
        """The tools the model may call: all, or only the one ``tool_choice`` names."""
        if self.function is None:
            return self.tools
        return [t for t in self.tools if t["function"]["name"] == self.function]


_NEUTRAL_CHOICES = (None, "auto", "none")


def _choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("auto", "none", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if not isinstance(name, str):
            raise ToolError("function.name must be a string", "tool_choice")
        if name not in names:
            raise ToolError(f"names no function of tools ({name[:64]!r})", "tool_choice")
        return "required", name
    raise ToolError('must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                    "tool_choice")


def parse(fields: dict[str, Any]) -> ToolSpec | None:
    """The request's tool spec, None when it offers no tools or forbids calling them
    (``tool_choice: "none"``: the prompt then renders no tools, as llama-server's does); ToolError
    for a bad field. Each parameter schema is converted to a grammar here, so one the engine could
    not constrain its output with is refused at the door, naming the tool."""
    parallel = fields.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("must be true or false", "parallel_tool_calls")
    given = fields.get("tools")
    tools = check_tools([] if given is None else given)
    choice, function = _choice(fields.get("tool_choice"), {t["function"]["name"] for t in tools})
    if not tools:
        if fields.get("tool_choice") not in _NEUTRAL_CHOICES:
            raise ToolError("needs tools to choose from", "tool_choice")
        return None
    for i, tool in enumerate(tools):
        try:
            check_schema(tool["function"]["parameters"])
        except GrammarError as exc:
            raise ToolError(str(exc), f"tools[{i}].function.parameters") from None
    if choice == "none":
        return None
    return ToolSpec(tools=tools, choice=choice, function=function, parallel=bool(parallel))  # type: ignore[arg-type]


# ----- messages --------------------------------------------------------------------------


def _short_text(obj: dict[str, Any], key: str, limit: int, where: str) -> str:
    """An optional string field (absent or null: empty) of at most ``limit`` characters."""
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise ToolError(f"must be a string of at most {limit} characters", where)
    return value


def _call(call: Any, where: str) -> dict[str, Any]:
    """One call of an assistant message, normalised: ``{"id", "type", "function": {"name",
    "arguments"}}`` with the arguments as JSON text (OpenAI sends text; some clients an object)."""
    if not isinstance(call, dict):
        raise ToolError("must be an object", where)
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not NAME_RE.fullmatch(fn["name"]):
        raise ToolError("must name a function (1 to 64 letters, digits, underscores or dashes)", f"{where}.function.name")
    call_id = _short_text(call, "id", MAX_CALL_ID, f"{where}.id")
    args = fn.get("arguments", "{}")
    if isinstance(args, dict):
        _finite(args, f"{where}.function.arguments")
        args = json.dumps(args, ensure_ascii=False)
    if not isinstance(args, str) or len(args) > MAX_ARGUMENTS:
        raise ToolError(f"must be JSON text of at most {MAX_ARGUMENTS} characters", f"{where}.function.arguments")
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def message_fields(m: dict[str, Any], role: str, where: str) -> dict[str, str]:
    """The tool fields of one chat message, as they travel: an assistant's ``tool_calls`` (JSON
    text of the normalised calls), a tool result's ``tool_call_id`` and ``name``."""
    out: dict[str, str] = {}
    calls = m.get("tool_calls")
    if calls not in (None, []):
        if role != "assistant":
            raise ToolError("only an assistant message carries tool calls", f"{where}.tool_calls")
        if not isinstance(calls, list) or len(calls) > MAX_CALLS:
            raise ToolError(f"must be a list of at most {MAX_CALLS} calls", f"{where}.tool_calls")
        out["tool_calls"] = json.dumps([_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)],
                                       ensure_ascii=False)
    if role == "tool":
        for key, limit in (("tool_call_id", MAX_CALL_ID), ("name", 64)):
            value = m.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or len(value) > limit:
                raise ToolError(f"must be a string of at most {limit} characters", f"{where}.{key}")
            out[key] = value
    return out


def calls_of(message: dict[str, str]) -> list[dict[str, Any]]:
    """The normalised calls an assistant message carries (none when it carries none)."""
    text = message.get("tool_calls")
    return json.loads(text) if text else []

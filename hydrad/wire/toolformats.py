"""How a model is asked to call tools, in the two formats llama-server falls back on most: what
goes into the prompt and the grammar that keeps a small model's answer well formed.

- **Hermes** (Hermes 2 Pro, Qwen 2.5, ...): the chat template itself renders ``tools`` and
  expects calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Chosen when the
  template mentions ``<tool_call>``, as llama.cpp's ``common/chat.cpp`` detects it.
- **Generic** (every other template, SmolLM2's and Gemma's included): a system instruction lists
  the tools and the model answers with one JSON object, ``{"tool_call": {"name", "arguments"}}``
  (``{"tool_calls": [...]}`` when calls may be parallel) or ``{"response": "..."}``; a grammar made
  from that schema holds every answer to it. History is rewritten into the same JSON: an assistant's
  calls become its content, a tool's result a user turn holding ``{"tool_response": ...}``.

``tool_choice: "required"`` (or a named function) leaves only calls in the grammar. In the Hermes
format ``auto`` is free text (llama-server constrains it lazily, from the first ``<tool_call>``,
which this engine does not do); the answer is parsed either way (:mod:`hydrad.wire.toolcalls`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from hydrad.wire.grammar import MAX_TOOLS_GRAMMAR_CHARS, framed_schema_grammar, schema_grammar
from hydrad.wire.tools import ToolSpec, calls_of

Format = Literal["generic", "hermes"]

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"


def format_for(template: str | None) -> Format:
    """The tool-call format a chat template speaks (a template name, or None, speaks none)."""
    return "hermes" if template and HERMES_OPEN in template else "generic"


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False}


def _any_call(spec: ToolSpec) -> dict[str, Any]:
    schemas = [_call_schema(t) for t in spec.offered()]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def generic_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON schema of a generic answer, as llama.cpp's generic format makes it."""
    call = _any_call(spec)
    if spec.parallel:
        calls: dict[str, Any] = {"type": "object", "properties": {"tool_calls": {
            "type": "array", "items": call, "minItems": 1}}, "required": ["tool_calls"], "additionalProperties": False}
    else:
        calls = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
                 "additionalProperties": False}
    if spec.choice == "required":
        return calls
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
              "additionalProperties": False}
    return {"anyOf": [calls, answer]}


def grammar(fmt: Format, spec: ToolSpec) -> str | None:
    """The GBNF an answer in ``fmt`` is held to; None for free text (Hermes, ``auto``)."""
    if fmt == "generic":
        return schema_grammar(generic_schema(spec), MAX_TOOLS_GRAMMAR_CHARS)
    if spec.choice != "required":
        return None
    return framed_schema_grammar(_any_call(spec), HERMES_OPEN + "\n", "\n" + HERMES_CLOSE, spec.parallel,
                                 MAX_TOOLS_GRAMMAR_CHARS)


def _instruction(spec: ToolSpec) -> str:
    tools = json.dumps([t["function"] for t in spec.offered()], ensure_ascii=False, indent=2)
    example = ('{"tool_calls": [{"name": "<function name>", "arguments": {...}}]}' if spec.parallel
               else '{"tool_call": {"name": "<function name>", "arguments": {...}}}')
    if spec.choice == "required":
        how = f"Respond in JSON format with `tool_call{'s' if spec.parallel else ''}`, a request to call tools:\n{example}"
    else:
        how = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
               f"reply to the user's request:\n{example}\nor\n" + '{"response": "<your reply>"}')
    return f"You can call any of the following tools to satisfy the user's requests:\n{tools}\n\n{how}"


def generic_messages(messages: list[dict[str, str]], spec: ToolSpec | None) -> list[dict[str, str]]:
    """The conversation as a template without tool support reads it: the tools' instruction in the
    system turn (after the client's own system text), calls and results as JSON text. Without a
    spec (no tools offered, or ``tool_choice: "none"``) only the history's calls and results are
    rewritten, and the model answers in plain text."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content", "")
        calls = calls_of(m)
        if calls:
            listed = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                      for c in calls]
            content = json.dumps({"tool_calls": listed} if len(listed) > 1 else {"tool_call": listed[0]},
                                 ensure_ascii=False)
        elif role == "tool":
            role = "user"
            result: dict[str, Any] = {"content": content}
            if m.get("name"):
                result = {"tool": m["name"], **result}
            if m.get("tool_call_id"):
                result["id"] = m["tool_call_id"]
            content = json.dumps({"tool_response": result}, ensure_ascii=False)
        elif role == "assistant" and spec is not None:
            content = json.dumps({"response": content}, ensure_ascii=False)
        out.append({"role": role, "content": content})
    if spec is None:
        return out
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + _instruction(spec)}
    else:
        out.insert(0, {"role": "system", "content": _instruction(spec)})
    return out


def _arguments(text: str) -> Any:
    """A call's arguments as the template shows them: the object when the text is JSON, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def template_messages(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The conversation as a tool-aware (jinja) template reads it: calls as objects whose
    ``arguments`` are objects (Hermes-style templates write them with ``tojson``), results with
    their ``tool_call_id`` and ``name``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {k: v for k, v in m.items() if k != "tool_calls"}
        calls = calls_of(m)
        if calls:
            msg["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                                 for c in calls]
        out.append(msg)
    return out

"""A chat request's prompt when tools are in play: which tool-call format the engine's template
speaks, the prompt in that format, and the grammar its answer is held to.

The format is the template's (:func:`hydrad.wire.toolformats.format_for`): the ``chat_template``
parameter when it is template text, else the model's own. A Hermes-style template is rendered
with jinja, under a time and a memory limit (``jinjabox``), and given ``tools``; any other keeps
llama.cpp's formatter and gets the generic format's instruction and JSON history. A request without tools, whose history holds no calls or
results, takes the engine's ordinary path unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from hydrad.engine import jinjabox, llama
from hydrad.wire import toolformats
from hydrad.wire.requests import GenRequest
from hydrad.wire.toolformats import Format
from hydrad.wire.tools import ToolSpec


def _template_text(model: llama.Model, template: str | None) -> str | None:
    """The jinja text of the template in use; None for a built-in template named by ``template``."""
    if template:
        return template if "{" in template else None
    raw = model.chat_template
    text = raw.decode("utf-8", "replace") if raw else None
    return text if text and "{" in text else None


def tool_format(model: llama.Model, template: str | None) -> Format:
    return toolformats.format_for(_template_text(model, template))


def uses_tools(request: GenRequest) -> bool:
    """Whether the request offers tools or its history holds calls or results (which only the tool
    path renders)."""
    return request.tools is not None or any(
        "tool_calls" in m or m.get("role") == "tool" for m in request.messages or ())


Render = Callable[[list[dict[str, str]]], str]


def _prompt(model: llama.Model, template: str | None,
            request: GenRequest) -> tuple[list[dict[str, str]], Render | None]:
    """The messages the template is given and what renders them (None: llama.cpp's formatter with
    ``template``); ValueError when they cannot be rendered. One path for the tokens a chat
    completion generates from and the text ``/apply-template`` shows."""
    messages = request.messages or []
    if not uses_tools(request):
        return messages, None
    spec = request.tools
    text = _template_text(model, template)
    if toolformats.format_for(text) == "generic":
        return toolformats.generic_messages(messages, spec), None
    assert text is not None
    tools = spec.offered() if spec is not None else None
    _refuse_special_text(model, tools, messages)
    bos, eos = (_token_text(model, f(model.vocab)) for f in (llama.lib().llama_vocab_bos, llama.lib().llama_vocab_eos))

    def render(ms: list[dict[str, str]]) -> str:
        return jinjabox.render(text, toolformats.template_messages(ms), tools, bos, eos)

    return messages, render


def chat_tokens(model: llama.Model, template: str | None, request: GenRequest,
                max_chars: int | None = None) -> list[int]:
    """The prompt tokens of a chat request; ValueError when the template cannot render it
    (:class:`llama.PromptTextTooLong` when its text passes ``max_chars``, before it is tokenized)."""
    messages, render = _prompt(model, template, request)
    return model.chat_tokens(messages, template, render, max_chars)


def chat_text(model: llama.Model, template: str | None, request: GenRequest) -> str:
    """The prompt of a chat request as text (llama-server's ``/apply-template``): what
    :func:`chat_tokens` tokenizes, tools included."""
    messages, render = _prompt(model, template, request)
    return render(messages) if render is not None else model.apply_chat_template(messages, template)


def grammar(model: llama.Model, template: str | None, spec: ToolSpec) -> str | None:
    """The grammar a request's answer is held to (GrammarError if its tools make none)."""
    return toolformats.grammar(tool_format(model, template), spec)


def _token_text(model: llama.Model, token: int) -> str:
    return model.piece(token).decode("utf-8", "replace") if token >= 0 else ""


def _refuse_special_text(model: llama.Model, tools: Any, messages: list[dict[str, str]]) -> None:
    """A jinja template writes tools and calls into the prompt itself, outside the message bodies
    that :meth:`llama.Model.chat_tokens` keeps apart from the template's markers: text there that
    would tokenize as a marker (``<|im_start|>``) is refused rather than let a client open a turn."""
    written = json.dumps([tools, [m.get("tool_calls", "") for m in messages],
                          [m.get("name", "") + m.get("tool_call_id", "") for m in messages]], ensure_ascii=False)
    if model.has_special_text(written):
        raise ValueError("tools: the tools or the calls of the history contain the model's special-token text")

"""A chat request's prompt: which tool-call format the engine's template speaks, the prompt in that
format, the grammar its answer is held to, and the variables the template is given.

The format is the template's (:func:`hydrad.wire.toolformats.format_for`): the ``chat_template``
parameter when it is template text, else the model's own. A chat is rendered with jinja, under a
time and a memory limit (``jinjabox``), when it needs what only the template's own logic does:
tools in the Hermes format (given ``tools``), template variables (the engine's
``default_template_kwargs``, the request's ``chat_template_kwargs``, ``enable_thinking: false`` for a
reasoning budget of 0), or a thinking template (one that mentions ``<think>``: its generation prompt
may open the think block, and it leaves earlier reasoning out, which llama.cpp's formatter does
not do), or one that writes today's date (``strftime_now``, or the ``date_string`` and
``datetime`` variables llama-server gives every template; llama.cpp's formatter writes no date). Any other chat keeps llama.cpp's formatter; with tools in the generic format it gets their
instruction and JSON history.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from hydrad.engine import jinjabox, llama
from hydrad.wire import toolformats
from hydrad.wire.reasoning import OPEN
from hydrad.wire.requests import GenRequest
from hydrad.wire.toolformats import Format
from hydrad.wire.tools import ToolSpec


DATE_NAMES = ("strftime_now", "date_string", "datetime")
"""What a template that writes today's date reads (Llama 3's system header, FireFunction's)."""


def _own_logic(text: str | None) -> bool:
    """Whether a template does what only its own logic does: open a think block, write the date."""
    return text is not None and (OPEN in text or any(name in text for name in DATE_NAMES))


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


class KwargsRefused(ValueError):
    """The request's ``chat_template_kwargs`` cannot be given to the template in use (a 400 naming the field)."""

    param = "chat_template_kwargs"


def budget(request: GenRequest, params: Any) -> int | None:
    """A chat's reasoning budget in tokens (the request's, else the engine's); None: no limit."""
    b = params.reasoning_budget if request.reasoning_budget is None else request.reasoning_budget
    return None if b < 0 else b


def template_kwargs(request: GenRequest, params: Any) -> dict[str, Any] | None:
    """What the template is given besides the chat: the engine's ``default_template_kwargs``, the
    request's ``chat_template_kwargs`` over them, and ``enable_thinking: false`` for a budget of 0
    (as llama-server renders a budget of 0)."""
    kwargs = {**(params.default_template_kwargs or {}), **(request.chat_template_kwargs or {})}
    if budget(request, params) == 0:
        kwargs["enable_thinking"] = False
    return kwargs or None


def off_thread(model: llama.Model, template: str | None, request: GenRequest,
               kwargs: dict[str, Any] | None) -> bool:
    """Whether a chat's prompt is made in a way that may take time (a jinja render in its own process,
    or the tools' rewriting): then it is prepared off the engine thread."""
    if request.messages is None:
        return False
    if uses_tools(request) or kwargs:
        return True
    return _own_logic(_template_text(model, template))


def _prompt(model: llama.Model, template: str | None, request: GenRequest,
            kwargs: dict[str, Any] | None = None,
            add_generation_prompt: bool = True) -> tuple[list[dict[str, str]], Render | None]:
    """The messages the template is given and what renders them (None: llama.cpp's formatter with
    ``template``); ValueError when they cannot be rendered. One path for the tokens a chat
    completion generates from and the text ``/apply-template`` shows."""
    messages = request.messages or []
    text = _template_text(model, template)
    tools = None
    hermes = False
    if uses_tools(request):
        if toolformats.format_for(text) == "generic":
            messages = toolformats.generic_messages(messages, request.tools)
        else:
            hermes = True
            tools = request.tools.offered() if request.tools is not None else None
    if not (hermes or kwargs or _own_logic(text)):
        return messages, None
    if text is None:  # a built-in template: no variables to give, no thinking to switch off
        if request.chat_template_kwargs:
            raise KwargsRefused("chat_template_kwargs: the chat template in use is one of llama.cpp's built-in "
                                "templates, which take no variables; set chat_template to template text")
        return messages, None
    if hermes:
        _refuse_special_text(model, tools, messages)
    if request.chat_template_kwargs and model.has_special_text(json.dumps(request.chat_template_kwargs,
                                                                          ensure_ascii=False)):
        raise KwargsRefused("chat_template_kwargs: a value contains the model's special-token text")
    bos, eos = (_token_text(model, f(model.vocab)) for f in (llama.lib().llama_vocab_bos, llama.lib().llama_vocab_eos))

    def render(ms: list[dict[str, str]]) -> str:
        return jinjabox.render(text, toolformats.template_messages(ms), tools, bos, eos, kwargs, add_generation_prompt)

    return messages, render


def chat_tokens(model: llama.Model, template: str | None, request: GenRequest,
                max_chars: int | None = None, kwargs: dict[str, Any] | None = None) -> list[int]:
    """The prompt tokens of a chat request (``kwargs``: :func:`template_kwargs`); ValueError when the
    template cannot render it (:class:`llama.PromptTextTooLong` when its text passes ``max_chars``,
    before it is tokenized)."""
    messages, render = _prompt(model, template, request, kwargs)
    return model.chat_tokens(messages, template, render, max_chars)


def chat_text(model: llama.Model, template: str | None, request: GenRequest,
              kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True) -> str:
    """The prompt of a chat request as text (llama-server's ``/apply-template``): what
    :func:`chat_tokens` tokenizes, tools and template variables included; without the assistant's
    turn opened when ``add_generation_prompt`` is false."""
    messages, render = _prompt(model, template, request, kwargs, add_generation_prompt)
    if render is not None:
        return render(messages)
    return model.apply_chat_template(messages, template, add_generation_prompt)


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

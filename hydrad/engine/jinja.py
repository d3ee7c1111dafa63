"""Chat templates rendered with jinja, as transformers and llama-server's ``--jinja`` render them:
the way a template that knows tools receives ``tools`` and messages carrying calls, which
llama.cpp's built-in formatter (role and content only) cannot pass.

Used only for requests with tools on a template that speaks a tool-call format
(:mod:`hydrad.wire.toolformats`); every other prompt keeps llama.cpp's formatter. The template is
the engine's configuration, not a client's, but it still runs in jinja's sandbox: a template may
read what it is given and call the helpers below, nothing else. The sandbox bounds what a template
may *touch*, not how long it runs or how much it makes, so the engine renders in a process of its
own under a time and a memory limit (:mod:`hydrad.engine.jinjabox`); :func:`render` is what that
process runs, and it stops a template whose output passes ``max_chars`` as it is written.
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any


class TemplateFailed(ValueError):
    """The template would not render these messages (its own ``raise_exception`` included)."""


def _raise(message: str) -> None:
    raise TemplateFailed(f"the chat template refused the messages: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: plain JSON (jinja's own escapes HTML and sorts keys)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _today() -> dict[str, str]:
    now = datetime.datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


@functools.lru_cache(maxsize=8)
def _compiled(text: str) -> Any:
    # jinja2 is imported here, at the first request with tools, not at every engine's boot (about 40 ms
    # of a model-less engine's second to READY=1 on the 2-core machine)
    from jinja2 import Undefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Joinable(Undefined):
        """An undefined variable added to a value is that value, as llama-server's jinja renders it
        (FireFunction's template adds ``functions``, which only its own tool path ever defined);
        anything else done with it still fails."""

        def __add__(self, other: Any) -> Any:
            return other

        __radd__ = __add__

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
                                        undefined=_Joinable)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(text)


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           bos_token: str, eos_token: str, max_chars: int | None = None,
           kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True) -> str:
    """The prompt for ``messages`` with the assistant's turn opened (unless ``add_generation_prompt``
    is false), ``kwargs`` given as further variables (:mod:`hydrad.common.templatekwargs` keeps them
    from replacing the ones above); TemplateFailed if the template does not compile, refuses to
    render, or writes more than ``max_chars`` characters.

    ``enable_thinking`` is true unless ``kwargs`` say otherwise, as llama-server gives it to every
    template: a template that tests ``not enable_thinking`` would otherwise close its think block
    for a chat that never asked it to. ``date_string`` ("07 Dec 2026") and ``datetime`` ("Dec 07
    2026") are today's date, llama-server's names for it (Llama 3's template writes its own
    cut-off date otherwise)."""
    from jinja2 import TemplateError

    try:
        parts: list[str] = []
        size = 0
        for piece in _compiled(template).generate({**_today(), "enable_thinking": True, **(kwargs or {}), "messages": messages,
                                                   "tools": tools, "add_generation_prompt": add_generation_prompt, "bos_token": bos_token,
                                                   "eos_token": eos_token}):
            size += len(piece)
            if max_chars is not None and size > max_chars:
                raise TemplateFailed(f"the chat template wrote more than {max_chars} characters (max_output_chars); "
                                     "it was stopped")
            parts.append(piece)
        return "".join(parts)
    except TemplateFailed:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
        raise TemplateFailed(f"the chat template failed: {type(exc).__name__}: {exc}"[:500]) from None

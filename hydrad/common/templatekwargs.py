"""Extra variables for a jinja chat template (llama-server's ``chat_template_kwargs``): what a
request or an engine's ``default_template_kwargs`` may hand the template, checked the same way
wherever they arrive (a door, the bus, a configure payload).

They are written into the prompt by a template the operator chose, so they are bounded like any
other part of a request (a few dozen names, a few KiB of JSON) and may not replace what the engine
itself gives the template (``messages``, ``tools``, ``add_generation_prompt``, the BOS and EOS texts,
its helpers): a kwarg is a template's switch (``enable_thinking``), not a way round the chat path.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_KWARGS = 32
"""Most names one set of kwargs may hold."""

MAX_KWARGS_BYTES = 16 << 10
"""Longest a set of kwargs may be, as compact JSON."""

RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now"})
"""What the engine gives every template itself."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def check(kwargs: Any) -> dict[str, Any]:
    """``kwargs`` as a template's extra variables; ValueError saying which name or bound is at fault."""
    if not isinstance(kwargs, dict):
        raise ValueError("must be an object of template variables")
    if len(kwargs) > MAX_KWARGS:
        raise ValueError(f"at most {MAX_KWARGS} template variables (got {len(kwargs)})")
    for name in kwargs:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{str(name)[:64]!r} is not a template variable name (letters, digits and _, "
                             "at most 64, not starting with a digit)")
        if name in RESERVED:
            raise ValueError(f"{name!r} is given to the template by the engine itself")
    try:
        size = len(json.dumps(kwargs, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode())
    except (TypeError, ValueError):
        raise ValueError("values must be JSON (finite numbers, strings, booleans, null, lists, objects)") from None
    if size > MAX_KWARGS_BYTES:
        raise ValueError(f"at most {MAX_KWARGS_BYTES} bytes of JSON (got {size})")
    return kwargs

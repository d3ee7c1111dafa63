"""``logit_bias`` as OpenAI and llama-server take it, read into one bounded list.

Forms accepted (each entry's bias is a number, or ``false`` for "never this token"):

- OpenAI's object of token ids: ``{"15043": 2.5, "50256": -100}``;
- llama-server's object, whose keys that are not integers are text: ``{"Hello": -1}``;
- llama-server's list of pairs: ``[[15043, 1.0], ["Hello", -1], [198, false]]``.

A text entry biases every token the model splits it into (the engine tokenizes it, as llama-server
does); a token id outside the model's vocabulary is refused there, naming ``logit_bias``. Bounded
before anything grows: at most :data:`MAX_ENTRIES` entries, :data:`MAX_TEXT` characters a text and
:data:`MAX_TEXT_TOTAL` in all, and finite biases of at most :data:`MAX_BIAS` either way.
"""

from __future__ import annotations

import math
from typing import Any

MAX_ENTRIES = 1024
MAX_TEXT = 256
MAX_TEXT_TOTAL = 16 << 10
MAX_BIAS = 1e6
INT32_MAX = 2**31 - 1

Bias = tuple[int | str, float | None]
"""One entry: a token id or a text, and its bias (None: banned)."""


class LogitBiasError(ValueError):
    """A ``logit_bias`` a request may not send; its message says which entry and why."""

    param = "logit_bias"


def _bias(value: Any, where: str) -> float | None:
    if value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > MAX_BIAS:
        raise LogitBiasError(f"logit_bias{where}: a bias is a finite number of at most {MAX_BIAS:g} either way, "
                             "or false to ban the token")
    return float(value)


def _target(value: Any, where: str, keyed: bool) -> int | str:
    if isinstance(value, bool):
        raise LogitBiasError(f"logit_bias{where}: a token id or a text")
    if isinstance(value, int):
        if not 0 <= value <= INT32_MAX:
            raise LogitBiasError(f"logit_bias{where}: token id {value} out of range")
        return value
    if isinstance(value, str):
        if keyed and value.strip().lstrip("-").isdigit():  # an object's key naming a token id
            token = int(value)
            if not 0 <= token <= INT32_MAX:
                raise LogitBiasError(f"logit_bias{where}: token id {token} out of range")
            return token
        if not value or len(value) > MAX_TEXT:
            raise LogitBiasError(f"logit_bias{where}: a text of 1 to {MAX_TEXT} characters")
        return value
    raise LogitBiasError(f"logit_bias{where}: a token id or a text")


def parse(value: Any) -> list[Bias] | None:
    """The request's ``logit_bias`` as entries (None or empty: no bias); LogitBiasError when it is
    not one of the forms above or passes a bound."""
    if value is None:
        return None
    if isinstance(value, dict):
        items = [(k, v, f"[{k!r}]", True) for k, v in value.items()]
    elif isinstance(value, list):
        items = []
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                raise LogitBiasError(f"logit_bias[{i}]: a pair [token id or text, bias]")
            items.append((pair[0], pair[1], f"[{i}]", False))
    else:
        raise LogitBiasError("logit_bias: an object of token ids (or texts) to biases, or a list of pairs")
    if len(items) > MAX_ENTRIES:
        raise LogitBiasError(f"logit_bias: {len(items)} entries; at most {MAX_ENTRIES}")
    out: list[Bias] = [(_target(k, where, keyed), _bias(v, where)) for k, v, where, keyed in items]
    if sum(len(t) for t, _ in out if isinstance(t, str)) > MAX_TEXT_TOTAL:
        raise LogitBiasError(f"logit_bias: its texts have more than {MAX_TEXT_TOTAL} characters in all")
    return out or None

"""Model overrides as llama.cpp's command line writes them: ``-ot REGEX=BUFFER_TYPE`` and
``--override-kv KEY=TYPE:VALUE``, parsed and checked once for the engine's parameters, the
coordinator's profiles and the loader alike (each a list of strings in the YAML and on the wire).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def check_tensor_override(item: str) -> tuple[str, str]:
    """One ``override_tensors`` entry in llama.cpp's -ot syntax → (regex, buffer type); ValueError
    names what is wrong. Used by the engine's parameters and the coordinator's profiles alike."""
    pattern, sep, target = item.rpartition("=")
    if not sep or not pattern or not target:
        raise ValueError(f"{item!r} is not REGEX=BUFFER_TYPE")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{item!r}: bad regular expression ({exc})") from None
    return pattern, target


KV_TYPES = ("int", "float", "bool", "str")
KV_KEY_BYTES = 127  # llama_model_kv_override.key is char[128]
KV_STR_BYTES = 127  # and val_str char[128], NUL included


@dataclass(frozen=True)
class KvOverride:
    """One ``kv_overrides`` entry, parsed: what llama.cpp's ``llama_model_kv_override`` will hold."""

    key: str
    type: str  # one of KV_TYPES
    value: int | float | bool | str

    @property
    def text(self) -> str:
        """The entry in llama-server's --override-kv syntax (what the engine reports back)."""
        v = ("true" if self.value else "false") if isinstance(self.value, bool) else self.value
        return f"{self.key}={self.type}:{v}"


def parse_kv_override(item: str) -> KvOverride:
    """One ``kv_overrides`` entry, ``KEY=TYPE:VALUE``, parsed as llama-server parses ``--override-kv``
    (common.cpp's ``string_parse_kv_override``: the first ``=`` ends the key, the type prefix picks the
    union member), but stricter where llama-server would load something else than written: an int or
    float must be one whole number (``atol("12abc")`` is 12 there), and a float finite. ValueError
    names what is wrong."""
    key, sep, rest = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{item!r} is not KEY=TYPE:VALUE (e.g. 'tokenizer.ggml.add_bos_token=bool:false')")
    if len(key.encode()) > KV_KEY_BYTES or not key.isprintable() or key != key.strip():
        raise ValueError(f"{item!r}: the key must be at most {KV_KEY_BYTES} bytes of printable text")
    kind, colon, text = rest.partition(":")
    if not colon or kind not in KV_TYPES:
        raise ValueError(f"{item!r}: the type must be one of {', '.join(KV_TYPES)} (TYPE:VALUE after the '=')")
    value: int | float | bool | str
    if kind == "int":
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(f"{item!r}: {text!r} is not a whole number") from None
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"{item!r}: {value} does not fit llama.cpp's 64-bit integer")
    elif kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{item!r}: {text!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{item!r}: a float override must be finite")
    elif kind == "bool":
        if text not in ("true", "false"):
            raise ValueError(f"{item!r}: a bool is true or false, not {text!r}")
        value = text == "true"
    else:
        if len(text.encode()) > KV_STR_BYTES or "\x00" in text:
            raise ValueError(f"{item!r}: a str value is at most {KV_STR_BYTES} bytes (llama.cpp's char[128]), "
                             "without NUL")
        value = text
    return KvOverride(key, kind, value)

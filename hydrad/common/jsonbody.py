"""Parse a JSON request body once, with the limits every door applies before a field is read.

JSON is more permissive than the text it carries is allowed to be: ``"\\ud800"`` is valid
JSON for a lone UTF-16 surrogate that no UTF-8 encoder accepts, so it passes the parser and
blows up later wherever the string is encoded (the tokenizer, a ZeroMQ frame, a log line, the
error that echoes it). Deep nesting is valid JSON too, and recursive code meets it later as a
RecursionError. Both are refused here, with the path of the offending value, so the rest of
the code may assume clean text and shallow structures.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects a body may have. OpenAI and configure payloads need
five or six levels; a few dozen leaves room for tool schemas without inviting recursion bombs."""


class BodyError(ValueError):
    """A body that cannot be accepted; ``code`` is the OpenAI-style error code, ``param`` the
    JSON path of the offending value when there is one."""

    def __init__(self, message: str, code: str = "invalid_json", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def loads(raw: bytes | str, what: str = "request body", max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` plus the checks above; raises :class:`BodyError`, never anything else."""
    try:
        data = json.loads(raw if raw else b"null")
    except RecursionError:
        raise BodyError(f"{what} is nested more than {max_depth} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"{what} is not valid JSON: {_safe(str(exc))}") from None
    check(data, what, max_depth)
    return data


def dumps(obj: Any) -> bytes:
    """JSON as Starlette's ``JSONResponse`` writes it (compact, UTF-8, no NaN): for a body written
    on a worker thread, or one forwarded, which so never grows on the way."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def loads_object(raw: bytes | str, what: str = "request body", max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """:func:`loads` for bodies that must be a JSON object; an empty body is an empty object."""
    data = loads(raw or b"{}", what, max_depth)
    if not isinstance(data, dict):
        raise BodyError(f"{what} must be a JSON object")
    return data


def check(value: Any, what: str = "request body", max_depth: int = MAX_DEPTH) -> None:
    """Refuse lone surrogates anywhere (keys included) and nesting deeper than ``max_depth``.

    Iterative, so a structure built in Python (not only one parsed here) is checked without
    recursion. A value's path is written only for an error message: a prompt of four million token
    ids took 2.2 s when every element got its path as it was visited, and numbers need no check."""
    stack: list[tuple[Any, Any, int]] = [(value, None, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            _text(v, where, what)
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth >= max_depth:
            raise BodyError(f"{what} is nested more than {max_depth} levels deep", param=_path(where) or None)
        if isinstance(v, dict):
            for k, item in v.items():
                _text(k, where, what)
                if isinstance(item, _CHECKED):
                    stack.append((item, (where, k), depth + 1))
        elif any(issubclass(t, _CHECKED) for t in set(map(type, v))):  # a list of numbers is passed at C speed
            stack.extend((item, (where, i), depth + 1) for i, item in enumerate(v) if isinstance(item, _CHECKED))


_CHECKED = (str, dict, list)


def _path(where: Any) -> str:
    """``a.b[3]`` for a chain of (parent, key or index) pairs."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def _text(s: str, at: Any, what: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        path = _path(at)
        where = path or what
        raise BodyError(f"{where}: a lone UTF-16 surrogate (\\u{ord(s[exc.start]):04x}) at character {exc.start} "
                        "is not text; send valid Unicode", "invalid_unicode", path or None) from None


def _safe(s: str) -> str:
    """Text safe to put in an error message (a UTF-8 encoder accepts it)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")

"""Reading a YAML file that must hold a mapping: one place for the errors every config file shares
(unreadable, not UTF-8, bad YAML with line and column, wrong top level, non-string keys), each
naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hydrad.common.params import validation_message

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: str | Path, shape: str = "a mapping of settings") -> dict[str, Any]:
    """The file's top-level mapping; ValueError naming the file (and line) otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: top level must be {shape}, got {type(raw).__name__}")
    odd = [repr(k) for k in raw if not isinstance(k, str)]
    if odd:
        raise ValueError(f"{p}: names must be strings, got {', '.join(odd)} (quote keys like 'on' or 'yes')")
    return raw


def read_settings(path: str | Path, model: type[M]) -> tuple[M, dict[str, Any]]:
    """A daemon's settings file validated as ``model``, and its raw mapping; ValueError naming the
    file and every bad field (both daemons load their configs through this)."""
    raw = read_mapping(path)
    try:
        return model(**raw), raw
    except ValidationError as exc:
        raise ValueError(validation_message(exc, str(path))[0]) from None

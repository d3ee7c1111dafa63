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


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field. One class for
    both daemons' settings (each settings module re-exports it)."""


def read_mapping(path: str | Path, shape: str = "a mapping of settings") -> dict[str, Any]:
    """The file's top-level mapping; ConfigError (a ValueError) naming the file (and line) otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be {shape}, got {type(raw).__name__}")
    odd = [repr(k) for k in raw if not isinstance(k, str)]
    if odd:
        raise ConfigError(f"{p}: names must be strings, got {', '.join(odd)} (quote keys like 'on' or 'yes')")
    return raw


def read_settings(path: str | Path, model: type[M], under: dict[str, Any] | None = None) -> tuple[M, dict[str, Any]]:
    """A daemon's settings file validated as ``model`` (laid over ``under``, an engine's command-line
    layer, field by field: :func:`layered`), and the file's raw mapping; ValueError naming the file
    and every bad field (both daemons load their configs through this)."""
    raw = read_mapping(path)
    try:
        return model(**layered(under or {}, raw)), raw
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, str(path))[0]) from None


def layered(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``under`` field by field: a mapping is merged key by key, anything else
    (a value, a list) replaced whole. How a config file lies over an engine's command-line flags."""
    out = dict(under)
    for key, value in over.items():
        below = out.get(key)
        out[key] = layered(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def beside(base: Path, value: Path | None, default_name: str | None = None) -> Path | None:
    """A path named in a config file, resolved against that file's directory (so a unit started from
    ``/`` and a developer in the repository read it alike). With ``default_name``, an unset one
    becomes that file beside the config when it exists."""
    if value is None:
        if default_name is None:
            return None
        candidate = base / default_name
        return candidate if candidate.exists() else None
    return value if value.is_absolute() else (base / value).resolve()

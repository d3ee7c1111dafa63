"""Logging setup: one line per event, as logfmt or JSON, journald-aware.

Every event is a single line so that ``journalctl``, ``grep`` and log
shippers never see half an event; tracebacks are folded into an ``exc``
field instead of spilling over several lines.

Under systemd (``JOURNAL_STREAM`` set) each line starts with the sd-daemon
``<N>`` priority prefix so journald records the right severity, and the
timestamp is left out because journald stamps every entry itself.

Structured fields travel on the record as ``extra={"fields": {...}}``;
``log_event`` is the short way to write that.
"""

from __future__ import annotations

import json as jsonlib
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = [
    "JsonFormatter",
    "LogThrottle",
    "LogfmtFormatter",
    "format_value",
    "level_name",
    "log_event",
    "parse_level",
    "setup_logging",
    "syslog_priority",
    "under_journald",
]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Keys the formatter writes itself; a field with one of these names is
# renamed with a leading underscore so it cannot shadow them.
_RESERVED = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Scanned by the regex engine, not a Python loop per character: a route decision is logged per request.
_NEEDS_QUOTES = re.compile(r'[ "=\\\x00-\x1f\x7f]')
_TO_ESCAPE = re.compile(r'[\\"\x00-\x1f\x7f]')
_BAD_KEY = re.compile(r'[ "=\\\x00-\x1f]')


def syslog_priority(levelno: int) -> int:
    """Map a logging level to the syslog priority journald understands."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def level_name(levelno: int) -> str:
    """Lower-case name of the standard level at or below ``levelno``."""
    for name, number in (
        ("critical", logging.CRITICAL),
        ("error", logging.ERROR),
        ("warning", logging.WARNING),
        ("info", logging.INFO),
    ):
        if levelno >= number:
            return name
    return "debug"


def under_journald(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is the journal stream systemd handed us.

    ``JOURNAL_STREAM`` is inherited by children whose stderr may point
    elsewhere, so when the stream's file can be inspected its device and
    inode must match the variable; when it cannot (an in-memory stream),
    the variable alone decides.
    """
    env = os.environ if environ is None else environ
    value = env.get("JOURNAL_STREAM")
    if not value:
        return False
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return True
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return True
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def format_value(value: object) -> str:
    """Render a field value for logfmt, quoting only when a parser would need it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _format_float(value)
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + _TO_ESCAPE.sub(_escape_match, text) + '"'


def _format_float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0 or abs(value) >= 1e-3:
        return repr(round(value, 4))
    return f"{value:.4g}"


def _escape_match(m: re.Match[str]) -> str:
    c = m.group()
    return _ESCAPES.get(c) or f"\\u{ord(c):04x}"


def _format_key(key: str) -> str:
    cleaned = _BAD_KEY.sub("_", key) or "_"
    return "_" + cleaned if cleaned in _RESERVED else cleaned


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _record_fields(record: logging.LogRecord) -> Mapping[str, object]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, Mapping) else {}


class _OneLineFormatter(logging.Formatter):
    """Shared parts: journald prefix, timestamp choice, traceback text."""

    def __init__(self, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald

    def _prefix(self, record: logging.LogRecord) -> str:
        return f"<{syslog_priority(record.levelno)}>" if self.journald else ""

    def _exc_text(self, record: logging.LogRecord) -> str | None:
        if record.exc_info:
            return self.formatException(record.exc_info)
        return record.exc_text or None


class LogfmtFormatter(_OneLineFormatter):
    """``ts=... level=info logger=hydrad.engine msg="model loaded" key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        parts: list[str] = []
        if not self.journald:
            parts.append(f"ts={_timestamp(record)}")
        parts.append(f"level={level_name(record.levelno)}")
        parts.append(f"logger={format_value(record.name)}")
        parts.append(f"msg={format_value(record.getMessage())}")
        for key, value in _record_fields(record).items():
            parts.append(f"{_format_key(str(key))}={format_value(value)}")
        exc = self._exc_text(record)
        if exc:
            parts.append(f"exc={format_value(exc)}")
        if record.stack_info:
            parts.append(f"stack={format_value(record.stack_info)}")
        return self._prefix(record) + " ".join(parts)


class JsonFormatter(_OneLineFormatter):
    """One JSON object per line, for log shippers that prefer it to logfmt."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {}
        if not self.journald:
            event["ts"] = _timestamp(record)
        event["level"] = level_name(record.levelno)
        event["logger"] = record.name
        event["msg"] = record.getMessage()
        for key, value in _record_fields(record).items():
            event[_format_key(str(key))] = _json_safe(value)
        exc = self._exc_text(record)
        if exc:
            event["exc"] = exc
        if record.stack_info:
            event["stack"] = record.stack_info
        return self._prefix(record) + jsonlib.dumps(event, ensure_ascii=False, default=str)


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def parse_level(level: str | int) -> int:
    """Accept a level name (any case) or number; reject anything else loudly."""
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; expected one of {sorted(_LEVELS)}") from None


def log_event(
    logger: logging.Logger,
    level: str | int,
    msg: str,
    /,
    *,
    exc_info: bool = False,
    **fields: object,
) -> None:
    """Log ``msg`` with structured ``fields`` attached for the formatter.

    No positional args are passed, so ``%`` in ``msg`` is printed as is.
    """
    levelno = parse_level(level)
    if logger.isEnabledFor(levelno):
        logger.log(levelno, msg, exc_info=exc_info, extra={"fields": fields}, stacklevel=2)


class LogThrottle:
    """Logs an event that a peer can repeat at will (junk on a port, a stranger on the bus) at most once
    per ``interval_s`` per key, so that a flood costs a dictionary lookup per event instead of a log
    line; the next line logged for a key carries ``suppressed``, how many were left out meanwhile.
    Safe to call from several threads."""

    def __init__(self, interval_s: float = 10.0, max_keys: int = 10_000) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, logger: logging.Logger, level: str | int, key: str, msg: str, /, **fields: Any) -> bool:
        """Log unless ``key`` was logged less than ``interval_s`` ago; True when it was logged."""
        now = time.monotonic()
        with self._lock:
            last, skipped = self._seen.get(key, (-math.inf, 0))
            if now - last < self.interval_s:
                self._seen[key] = (last, skipped + 1)
                return False
            if len(self._seen) >= self.max_keys:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if skipped:
            fields["suppressed"] = skipped
        log_event(logger, level, msg, **fields)
        return True


class _HydraHandler(logging.StreamHandler[TextIO]):
    """Marks the handler ``setup_logging`` installed, so a second call replaces it."""


def setup_logging(level: str = "info", json: bool = False, *, stream: TextIO | None = None) -> logging.Handler:
    """Route all logging to ``stream`` (stderr by default), one line per event.

    Calling it again replaces the handler from the previous call rather than
    doubling every line.
    """
    levelno = parse_level(level)
    out = sys.stderr if stream is None else stream
    journald = under_journald(out)
    formatter: logging.Formatter = JsonFormatter(journald) if json else LogfmtFormatter(journald)
    handler = _HydraHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _HydraHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levelno)
    return handler

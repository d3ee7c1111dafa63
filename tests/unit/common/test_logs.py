"""Log line format: fields, quoting, journald prefixes, folded tracebacks."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydrad.common.logs import LogThrottle, format_value, log_event, setup_logging, under_journald

TS = r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture(autouse=True)
def restore_root_logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def capture(level: str = "debug", json_lines: bool = False) -> io.StringIO:
    stream = io.StringIO()
    setup_logging(level, json=json_lines, stream=stream)
    return stream


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_line_format_with_fields() -> None:
    out = capture()
    log_event(logging.getLogger("hydrad.engine"), "info", "model loaded", model="x", seconds=1.2)
    [line] = lines(out)
    assert re.fullmatch(TS + r' level=info logger=hydrad\.engine msg="model loaded" model=x seconds=1\.2', line)


def test_extra_fields_via_plain_logger() -> None:
    out = capture()
    logging.getLogger("hydrad.http").warning("slow", extra={"fields": {"ms": 250}})
    [line] = lines(out)
    assert line.endswith(" level=warning logger=hydrad.http msg=slow ms=250")


def test_level_filtering() -> None:
    out = capture("warning")
    log = logging.getLogger("hydrad.test")
    log_event(log, "info", "hidden")
    log_event(log, logging.ERROR, "shown")
    assert [line.split(" msg=")[1] for line in lines(out)] == ["shown"]


def test_unknown_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="verbose"):
        setup_logging("verbose")


def test_second_setup_replaces_handler() -> None:
    capture()
    out = capture()
    logging.getLogger("hydrad.test").info("once")
    assert len(lines(out)) == 1


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', r'"say \"hi\""'),
        ("a=b", '"a=b"'),
        ("back\\slash", r'"back\\slash"'),
        ("", '""'),
        ("line\nbreak", r'"line\nbreak"'),
        ("tab\there", r'"tab\there"'),
        ("bell\x07", r'"bell\u0007"'),
        ("naïve—ok", "naïve—ok"),
        (42, "42"),
        (True, "true"),
        (None, "null"),
        (1.23456789, "1.2346"),
        (1234.56789, "1234.5679"),
        (0.000012345, "1.234e-05"),
        (0.0, "0.0"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
    ],
)
def test_format_value(value: object, rendered: str) -> None:
    assert format_value(value) == rendered


def test_message_is_quoted_and_percent_is_literal() -> None:
    out = capture()
    log_event(logging.getLogger("hydrad.test"), "info", 'done 100% "ok"')
    assert lines(out)[0].endswith(r'msg="done 100% \"ok\""')


def test_field_named_like_builtin_key_cannot_shadow_it() -> None:
    out = capture()
    log_event(logging.getLogger("hydrad.test"), "info", "m", ts="fake", level="x")
    line = lines(out)[0]
    assert " _ts=fake _level=x" in line
    assert line.count(" level=") == 1


@pytest.mark.parametrize(
    ("level", "prefix"),
    [("debug", "<7>"), ("info", "<6>"), ("warning", "<4>"), ("error", "<3>"), ("critical", "<2>")],
)
def test_journald_prefix_and_no_timestamp(monkeypatch: pytest.MonkeyPatch, level: str, prefix: str) -> None:
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    out = capture()
    log_event(logging.getLogger("hydrad.engine"), level, "hello", n=1)
    [line] = lines(out)
    assert line == f"{prefix}level={level} logger=hydrad.engine msg=hello n=1"


def test_no_prefix_without_journal_stream() -> None:
    out = capture()
    logging.getLogger("hydrad.test").error("boom")
    assert lines(out)[0].startswith("ts=")


def test_journal_stream_checked_against_real_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with open(tmp_path / "err.log", "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert under_journald(stream)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not under_journald(stream)


def raise_nested() -> None:
    try:
        raise KeyError("inner")
    except KeyError as exc:
        raise RuntimeError("outer\nwith newline") from exc


def test_exception_folded_onto_one_line() -> None:
    out = capture()
    try:
        raise_nested()
    except RuntimeError:
        logging.getLogger("hydrad.engine").exception("load failed", extra={"fields": {"model": "m"}})
    [line] = lines(out)
    assert ' msg="load failed" model=m exc="Traceback (most recent call last):\\n' in line
    assert "RuntimeError: outer\\nwith newline" in line
    assert "KeyError: 'inner'" in line
    assert line.endswith('"')


def test_log_event_exc_info() -> None:
    out = capture()
    try:
        1 / 0  # noqa: B018 (raises the error it logs)
    except ZeroDivisionError:
        log_event(logging.getLogger("hydrad.test"), "error", "math", exc_info=True, step=3)
    [line] = lines(out)
    assert " step=3 exc=" in line
    assert "ZeroDivisionError: division by zero" in line


def test_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    out = capture(json_lines=True)
    log_event(logging.getLogger("hydrad.engine"), "info", "model loaded", model="x", seconds=1.25)
    event = json.loads(lines(out)[0])
    assert event.pop("ts").endswith("Z")
    assert event == {"level": "info", "logger": "hydrad.engine", "msg": "model loaded", "model": "x", "seconds": 1.25}

    monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    out = capture(json_lines=True)
    logging.getLogger("hydrad.test").warning("w")
    line = lines(out)[0]
    assert line.startswith("<4>{")
    assert "ts" not in json.loads(line[3:])


def test_a_throttled_event_is_logged_once_per_interval_and_counts_what_it_left_out() -> None:
    stream = capture("info")
    logger = logging.getLogger("hydrad.test.throttle")
    throttle = LogThrottle(interval_s=0.2)
    logged = [throttle(logger, logging.WARNING, "junk:peer", "junk", peer="p") for _ in range(50)]
    assert logged == [True] + [False] * 49
    assert throttle(logger, logging.WARNING, "junk:other", "junk", peer="q")  # keys apart
    time.sleep(0.25)
    assert throttle(logger, logging.WARNING, "junk:peer", "junk", peer="p")
    out = [line for line in lines(stream) if "junk" in line]
    assert len(out) == 3
    assert "suppressed" not in out[0] and "suppressed=49" in out[2]

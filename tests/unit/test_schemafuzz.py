"""The reliability program's schema scenario, without a pool: which 5xx are expected, the HAR report
read (also one cut short), the operations read from the console, and the skip when schemathesis
cannot be installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import schemafuzz as F


def _entry(method: str, url: str, status: int, text: str = "", body: str = "") -> dict:
    return {"startedDateTime": "2026-12-01T00:00:00+00:00", "time": 1.0,
            "request": {"method": method, "url": url, "postData": {"mimeType": "application/json", "text": body}},
            "response": {"status": status, "content": {"mimeType": "application/json", "text": text}}}


def _err(code: str) -> str:
    return json.dumps({"error": {"message": "m", "type": "server_error", "code": code, "param": None}})


def test_only_the_doors_5xx_by_design_are_expected() -> None:
    assert F.expected(501, "embeddings_disabled") and F.expected(501, "not_supported")
    assert F.expected(501, "reranking_disabled")
    assert F.expected(503, "queue_full") and F.expected(503, "context_full")
    assert not F.expected(503, "-"), "a 503 without error JSON"
    assert not F.expected(501, "other")
    for status in (500, 502, 504):
        assert not F.expected(status, "internal_error")


def test_the_har_report_is_counted_by_status_and_code(tmp_path: Path) -> None:
    entries = [_entry("GET", "http://h/health", 200), _entry("POST", "http://h/v1/chat/completions", 400, _err("x")),
               _entry("POST", "http://h/v1/embeddings", 501, _err("embeddings_disabled")),
               _entry("POST", "http://h/completion", 500, _err("internal_error"), '{"prompt": 1}'),
               _entry("POST", "http://h/completion", 0)]
    whole = json.dumps({"log": {"version": "1.2", "entries": entries}}, indent=4)
    (tmp_path / "whole.har").write_text(whole)
    run = F.DoorRun("engine", "http://h")
    F.read_har(tmp_path / "whole.har", run)
    assert run.requests == 5
    assert run.statuses == {"2xx": 1, "4xx": 1, "5xx": 2, "none": 1}
    assert run.server_errors == {"501 embeddings_disabled": 1, "500 internal_error": 1}
    assert run.unexpected == {"500 internal_error": 1}
    assert run.examples and run.examples[0].startswith("POST /completion -> 500")
    assert run.figures()["unexpected_5xx"] == 1
    # schemathesis writes the report as it goes: one cut short mid-entry still gives what it holds
    (tmp_path / "cut.har").write_text(whole[: whole.index('"http://h/completion"')])
    assert len(F.har_entries(tmp_path / "cut.har")) == 3


def test_operations_come_from_the_console(tmp_path: Path) -> None:
    run = F.DoorRun("engine", "http://h")
    F.read_operations("     Operations:       25 selected / 30 total\n", tmp_path / "none.xml", run)
    assert run.operations == 25


@pytest.mark.slow  # a venv made (ensurepip) before pip is refused: about 10 s
def test_a_schemathesis_that_cannot_be_installed_is_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "VENV", tmp_path / "venv")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as on a host without the package index
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(F.Unavailable, match="schemathesis"):
        F.install()
    res = F.scenario(None, 1)
    assert res.passed and res.figures["skipped"].startswith("schemathesis not installable (")

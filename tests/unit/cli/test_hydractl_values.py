"""hydractl's reading of ``key=value`` arguments: YAML values, minus YAML 1.1's boolean surprises."""

from __future__ import annotations

import io

import pytest

from hydrad.cli.common import CliError
from hydrad.cli.ctl.clients import normalize_url, split_url
from hydrad.cli.ctl.engine import ProgressLine, describe_applied, parse_assignments, parse_value


@pytest.mark.parametrize(("raw", "expected"), [
    ("4096", 4096),
    ("0.3", 0.3),
    ("-1", -1),
    ("[0.6,0.4]", [0.6, 0.4]),
    ("[0.6, 0.4]", [0.6, 0.4]),
    ("null", None),
    ("~", None),
    ("", None),
    ("true", True),
    ("false", False),
    ("True", True),
    ("FALSE", False),
    ("smollm2-135m", "smollm2-135m"),
    ("chatml", "chatml"),
    ("'4096'", "4096"),
    ('"null"', "null"),
    ("{a: 1}", {"a": 1}),
])
def test_yaml_values(raw: str, expected: object) -> None:
    value = parse_value(raw)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("word", ["on", "off", "On", "OFF", "yes", "no", "Yes", "NO", "y", "n"])
def test_yaml_11_booleans_stay_strings(word: str) -> None:
    assert parse_value(word) == word


def test_flash_attn_on_is_the_string_on() -> None:
    assert parse_assignments(["flash_attn=on"]) == {"flash_attn": "on"}


@pytest.mark.parametrize("raw", [
    "{% for m in messages %}{{ m.content }}{% endfor %}",
    "{{ bos_token }}",
    "a: b: c",
])
def test_unreadable_yaml_is_sent_as_typed(raw: str) -> None:
    assert parse_value(raw) == raw


def test_non_json_yaml_types_are_sent_as_typed() -> None:
    assert parse_value("2024-01-02") == "2024-01-02"


def test_assignments_split_on_the_first_equals_sign_only() -> None:
    assert parse_assignments(["chat_template=a=b", "n_ctx=4096", "model=null"]) == {
        "chat_template": "a=b", "n_ctx": 4096, "model": None}


def test_last_repeat_wins() -> None:
    assert parse_assignments(["n_ctx=1024", "n_ctx=2048"]) == {"n_ctx": 2048}


@pytest.mark.parametrize("item", ["n_ctx", "=4096", " =1"])
def test_malformed_assignment_is_refused(item: str) -> None:
    with pytest.raises(CliError) as exc:
        parse_assignments([item])
    assert exc.value.code == 2
    assert repr(item) in str(exc.value)


def test_leading_url_is_split_off() -> None:
    assert split_url(["https://gpu1:8080", "n_ctx=1"], "http://d") == ("https://gpu1:8080", ["n_ctx=1"])
    assert split_url(["n_ctx=1"], "http://d") == ("http://d", ["n_ctx=1"])
    assert split_url(["model=http://x"], "http://d") == ("http://d", ["model=http://x"])


def test_normalize_url() -> None:
    assert normalize_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert normalize_url("http://h:1/") == "http://h:1"


def test_describe_applied() -> None:
    assert describe_applied({"tier": "none", "action": "none", "changed": []}) == "no change"
    assert describe_applied({"tier": "T1", "action": "apply", "changed": ["temperature"]}) == \
        "applied T1 (apply): temperature"
    assert describe_applied({"tier": "T2", "action": "rebuild_context", "changed": ["n_ctx", "n_batch"],
                             "seconds": 0.0553}) == "applied T2 (rebuild_context): n_ctx, n_batch in 0.055s"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _rec(progress: float, phase: str = "loading") -> dict[str, object]:
    return {"id": 3, "model": "m", "phase": phase, "progress": progress}


def test_progress_in_a_log_prints_one_line_per_ten_percent() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    for p in (0.0, 0.02, 0.05, 0.11, 0.12, 0.35, 0.97):
        line.update(_rec(p))
    line.update(_rec(1.0, "done"))
    line.close()
    assert out.getvalue().splitlines() == [
        "load 3 m: loading 0%", "load 3 m: loading 11%", "load 3 m: loading 35%", "load 3 m: loading 97%",
        "load 3 m: done 100%"]


def test_progress_on_a_terminal_rewrites_one_line() -> None:
    out = _Tty()
    line = ProgressLine(out)
    line.update(_rec(0.5))
    line.update(_rec(1.0, "done"))
    line.close()
    text = out.getvalue()
    assert text.count("\r") == 2
    assert text.endswith("load 3 m: done 100%\n")
    assert text.count("\n") == 1

"""The body checks every door applies: lone surrogates and deep nesting refused with the path."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrad.common import jsonbody
from hydrad.common.jsonbody import BodyError


def test_lone_surrogate_is_named_by_its_path() -> None:
    with pytest.raises(BodyError) as exc:
        jsonbody.loads(b'{"messages":[{"role":"user","content":"ok\\ud800"}]}')
    assert exc.value.code == "invalid_unicode"
    assert exc.value.param == "messages[0].content"
    assert "\\ud800" in str(exc.value)
    str(exc.value).encode("utf-8")  # the message itself is safe to send


def test_surrogate_in_a_key_is_refused() -> None:
    with pytest.raises(BodyError, match="surrogate"):
        jsonbody.loads(b'{"a":{"\\udfffk":1}}')


def test_valid_pairs_and_non_ascii_pass() -> None:
    assert jsonbody.loads('{"t":"\\ud83d\\ude00 é 漢"}'.encode()) == {"t": "😀 é 漢"}


@pytest.mark.parametrize("depth", [33, 2000, 200_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    with pytest.raises(BodyError, match="nested"):
        jsonbody.loads(("[" * depth + "]" * depth).encode())


def test_nesting_at_the_bound_passes() -> None:
    assert jsonbody.loads(("[" * 32 + "]" * 32).encode()) is not None


def test_invalid_json_and_bad_utf8() -> None:
    with pytest.raises(BodyError, match="not valid JSON"):
        jsonbody.loads(b'{"a":')
    with pytest.raises(BodyError, match="not valid JSON"):
        jsonbody.loads(b'{"a":"\xff"}')
    with pytest.raises(BodyError, match="JSON object"):
        jsonbody.loads_object(b"[1]")
    assert jsonbody.loads_object(b"") == {}


json_values = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=30)


@given(json_values)
def test_any_json_either_parses_or_raises_body_error(value: object) -> None:
    raw = json.dumps(value, ensure_ascii=True)  # lone surrogates travel as \ud800 escapes
    try:
        parsed = jsonbody.loads(raw.encode())
    except BodyError as exc:
        str(exc).encode("utf-8")
        return
    json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # whatever passed is encodable text

"""llama-server's /tokenize and /detokenize on a real engine (SmolLM2): shapes, round trips, and
every field's bad values refused by name."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.engine import Engine

pytestmark = pytest.mark.model

TEXT = "Hello, world! Ünïcödé and <|im_start|> too."


def test_tokenize_and_detokenize_round_trip(smollm_engine: Engine) -> None:
    e = smollm_engine
    r = e.http.post("/tokenize", json={"content": TEXT})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    back = e.http.post("/detokenize", json={"tokens": tokens})
    assert back.status_code == 200 and back.json() == {"content": TEXT}
    # parse_special: the chat marker is one special token, or its characters as text
    special = e.http.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]
    plain = e.http.post("/tokenize", json={"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
    assert len(special) == 1 and len(plain) > 1
    with_bos = e.http.post("/tokenize", json={"content": "Hi", "add_special": True}).json()["tokens"]
    without = e.http.post("/tokenize", json={"content": "Hi"}).json()["tokens"]
    assert len(with_bos) >= len(without) and with_bos[-len(without):] == without
    pieces = e.http.post("/tokenize", json={"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    text = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert text.decode() == TEXT
    assert e.http.post("/tokenize", json={"content": ""}).json() == {"tokens": []}
    assert e.http.post("/detokenize", json={"tokens": []}).json() == {"content": ""}


@pytest.mark.parametrize("path, body, field", [
    ("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
    ("/tokenize", {"content": "x", "with_pieces": 1}, "with_pieces"),
    ("/tokenize", {"content": "x", "extra": 1}, "extra"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"), ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
    ("/detokenize", {"tokens": [True]}, "tokens"), ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"), ("/detokenize", {"tokens": [1.5]}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_fields_are_refused_by_name(shared_smollm_engine: Engine, path: str, body: dict[str, Any],
                                        field: str) -> None:
    r = shared_smollm_engine.http.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert shared_smollm_engine.http.get("/livez").status_code == 200


def test_without_a_model_it_is_a_503(start_engine: Callable[..., Engine]) -> None:
    e = start_engine()
    e.notify.wait_for("READY=1", 60)
    for path, body in (("/tokenize", {"content": "x"}), ("/detokenize", {"tokens": [1]})):
        r = e.http.post(path, json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_model", r.text


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                     | st.text(max_size=60), lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c,
                                                                                               max_size=3),
                     max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/tokenize", "/detokenize"]), body=st.one_of(
    st.fixed_dictionaries({}, optional={"content": st.one_of(st.text(max_size=200), _JSON),
                                        "add_special": _JSON, "parse_special": _JSON, "with_pieces": _JSON}),
    st.fixed_dictionaries({}, optional={"tokens": st.one_of(st.lists(st.integers(-5, 60000), max_size=50), _JSON)}),
    _JSON))
def test_any_body_gets_a_clear_answer(smollm_engine: Engine, path: str, body: Any) -> None:
    # Infinity goes out as the bare word Python writes: not JSON, a 400 as well
    r = smollm_engine.http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["code"], r.text
    assert smollm_engine.http.get("/livez").status_code == 200


def test_apply_template_and_props(smollm_engine: Engine) -> None:
    e = smollm_engine
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = e.http.post("/apply-template", json={"messages": msgs})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "Be brief." in prompt and "Hi" in prompt and prompt.rstrip().endswith("assistant")  # SmolLM2: ChatML
    for body, field in (({}, "messages"), ({"messages": "hi"}, "messages"), ({"messages": msgs, "x": 1}, "x"),
                        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role")):
        bad = e.http.post("/apply-template", json=body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == field, bad.text
    props = e.http.get("/props").json()
    assert props["total_slots"] == 4 and props["model_alias"] == "smollm2-135m"
    assert props["default_generation_settings"]["temperature"] == 0 and "im_start" in props["chat_template"]

"""llama-server's native POST /completion on a real engine (SmolLM2): the same text as
/v1/completions, llama-server's answer and stream shapes, token-id prompts, return_tokens, each
stop_type, and every field's bad values refused by name."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.engine import Engine

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"


def events(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The data events of a streamed /completion, decoded."""
    with http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    blocks = [b for b in raw.split("\n\n") if b.strip()]
    assert all(b.startswith("data: ") for b in blocks), raw
    return [json.loads(b[len("data: "):]) for b in blocks]


def check_shape(body: dict[str, Any]) -> None:
    for key, kind in (("content", str), ("tokens", list), ("id_slot", int), ("stop", bool), ("model", str),
                      ("tokens_predicted", int), ("tokens_evaluated", int), ("tokens_cached", int),
                      ("truncated", bool), ("stop_type", str), ("stopping_word", str), ("timings", dict),
                      ("generation_settings", dict)):
        assert isinstance(body.get(key), kind), (key, body)
    assert body["stop"] is True and body["truncated"] is False
    assert {"prompt_n", "predicted_n", "predicted_ms", "cache_n"} <= set(body["timings"])
    assert {"n_predict", "temperature", "top_k", "stop", "n_ctx"} <= set(body["generation_settings"])


def test_same_text_as_v1_completions_whole_and_streamed(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    openai = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0}).json()
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    check_shape(body)
    assert body["content"] == openai["choices"][0]["text"]
    assert body["tokens_predicted"] == openai["usage"]["completion_tokens"] == 12
    assert body["tokens_evaluated"] == openai["usage"]["prompt_tokens"]
    assert body["stop_type"] == "limit" and body["stopping_word"] == "" and body["tokens"] == []
    assert body["model"] == "smollm2-135m" and body["generation_settings"]["n_predict"] == 12
    evs = events(http, {"prompt": PROMPT, "n_predict": 12, "temperature": 0})
    *pieces, last = evs
    assert pieces and all(set(p) == {"index", "content", "tokens", "stop"} and p["stop"] is False for p in pieces)
    check_shape(last)
    assert "".join(p["content"] for p in pieces) + last["content"] == body["content"]
    assert last["stop_type"] == "limit" and last["tokens_predicted"] == 12
    # a stream carries the token ids of its pieces, as llama-server's does
    assert len([i for p in pieces for i in p["tokens"]] + last["tokens"]) == 12


def test_token_id_prompt_and_return_tokens(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    ids = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    text = http.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                          "return_tokens": True}).json()
    by_ids = http.post("/completion", json={"prompt": ids, "n_predict": 8, "temperature": 0,
                                            "return_tokens": True}).json()
    assert by_ids["content"] == text["content"] and by_ids["tokens_evaluated"] == len(ids)
    assert len(text["tokens"]) == text["tokens_predicted"] == 8 and by_ids["tokens"] == text["tokens"]
    back = http.post("/detokenize", json={"tokens": text["tokens"]}).json()["content"]
    assert back == text["content"]
    nested = http.post("/completion", json={"prompt": [ids], "n_predict": 8, "temperature": 0}).json()
    assert nested["content"] == text["content"]


def test_stop_types_and_cache(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    full = http.post("/completion", json={"prompt": "1, 2, 3, 4,", "n_predict": 12, "temperature": 0,
                                          "id_slot": 2}).json()
    assert " 7" in full["content"] and full["id_slot"] == 2, full
    cut = http.post("/completion", json={"prompt": "1, 2, 3, 4,", "n_predict": 12, "temperature": 0,
                                         "stop": ["7"], "return_tokens": True, "id_slot": 2}).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == "7" and cut["id_slot"] == 2
    assert cut["content"] == full["content"][:full["content"].index("7")]
    assert cut["tokens_cached"] > 0  # the same prompt again: its prefix came from the slot's cache
    fresh = http.post("/completion", json={"prompt": "1, 2, 3, 4,", "n_predict": 2, "temperature": 0,
                                           "cache_prompt": False, "id_slot": 2}).json()
    assert fresh["tokens_cached"] == 0 and fresh["generation_settings"]["cache_prompt"] is False
    eos = http.post("/completion", json={"prompt": "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
                                         "n_predict": -1, "temperature": 0}).json()
    assert eos["stop_type"] == "eos" and eos["generation_settings"]["n_predict"] == -1, eos
    assert http.post("/completion", json={"prompt": "Hi", "n_predict": 0}).json()["stop_type"] == "limit"
    grammar = http.post("/completion", json={"prompt": "Yes or no?", "n_predict": 8, "temperature": 0,
                                             "grammar": 'root ::= "yes" | "no"'}).json()
    assert grammar["content"] in ("yes", "no"), grammar


@pytest.mark.parametrize("body, field", [
    ({}, "prompt"), ({"prompt": 5}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [-1]}, "prompt"), ({"prompt": [10**9]}, "prompt"),
    ({"prompt": [True]}, "prompt"), ({"prompt": [1.5]}, "prompt"), ({"prompt": [49152]}, "prompt"),
    ({"prompt": {"prompt_string": 5}}, "prompt.prompt_string"),
    ({"prompt": {"prompt_string": "x", "images": []}}, "prompt"),
    ({"prompt": {"prompt_string": "x <__media__>"}}, "prompt.multimodal_data"),
    ({"prompt": "x", "n_probs": 101}, "n_probs"), ({"prompt": "x", "n_predict": -2}, "n_predict"),
    ({"prompt": "x", "n_predict": "eight"}, "n_predict"), ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_k": -1}, "top_k"), ({"prompt": "x", "return_tokens": [1]}, "return_tokens"),
    ({"prompt": "x", "cache_prompt": "maybe"}, "cache_prompt"), ({"prompt": "x", "id_slot": 99}, None),
    ({"prompt": "x", "stop": ["a"] * 5}, "stop"), ({"prompt": "x", "grammar": "root ::= ("}, "grammar"),
    ({"prompt": "x", "json_schema": {"type": "bogus"}}, "json_schema"), ({"prompt": "x", "n_cmpl": 2}, "n_cmpl"),
    ({"prompt": "x", "mirostat": 2}, "mirostat"), ({"prompt": "x", "seed": "s"}, "seed"),
])
def test_bad_fields_are_refused_by_name(shared_smollm_engine: Engine, body: dict[str, Any], field: str | None) -> None:
    r = shared_smollm_engine.http.post("/completion", json=body)
    assert r.status_code == 400, r.text
    if field is not None:
        assert r.json()["error"]["param"] == field, r.text
    assert shared_smollm_engine.http.get("/livez").status_code == 200


def test_completions_without_v1_is_the_native_completion_at_both_doors(
        solo_pool: tuple[Any, Engine]) -> None:
    """llama-server routes ``/completions`` (no ``/v1``) to its native completion, as ``/completion``;
    ``/v1/completions`` stays OpenAI's."""
    c, e = solo_pool
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0}
    want = e.http.post("/completion", json=body).json()["content"]
    for http in (e.http, c.http):
        r = http.post("/completions", json=body)
        assert r.status_code == 200, r.text
        check_shape(r.json())
        assert r.json()["content"] == want
        openai = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0}).json()
        assert openai["choices"][0]["text"] == want and "content" not in openai


def test_generation_settings_list_the_logit_biases(shared_smollm_engine: Engine) -> None:
    """llama-server's ``generation_settings.logit_bias``: the request's biases, and with ``ignore_eos``
    the end-of-generation tokens banned (bias null: -inf)."""
    http = shared_smollm_engine.http
    base = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}

    def biases(**kw: Any) -> list[dict[str, Any]]:
        r = http.post("/completion", json={**base, **kw})
        assert r.status_code == 200, r.text
        return list(r.json()["generation_settings"]["logit_bias"])

    assert biases() == [] and biases(ignore_eos=False) == []
    banned = biases(ignore_eos=True)
    eos = http.post("/tokenize", json={"content": "<|im_end|>", "parse_special": True}).json()["tokens"][0]
    assert banned and all(b["bias"] is None for b in banned) and eos in {b["token"] for b in banned}
    assert biases(logit_bias=[[5, -1.5]]) == [{"token": 5, "bias": -1.5}]

"""``logit_bias`` on a real SmolLM2, in each form llama-server and OpenAI send it, at the engine door
and through the front door (where it crosses the bus): a banned token is never chosen, a strongly
favoured one always is, a text biases the tokens it is split into, and a bias the model cannot take
is refused naming the field."""

from __future__ import annotations

from typing import Any, Callable

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

PROMPT = "The capital of France is"


def _complete(http: httpx.Client, **extra: Any) -> dict[str, Any]:
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0, "return_tokens": True,
                                       **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _first_id(http: httpx.Client, **extra: Any) -> int:
    return int(_complete(http, **extra)["tokens"][0])


@pytest.fixture(scope="module")
def engine(start_module_engine: Callable[..., Engine]) -> Engine:
    e = start_module_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_ctx": 1024})
    e.wait_ready()
    return e


def test_every_form_bans_and_favours_tokens(engine: Engine) -> None:
    http = engine.http
    plain = _complete(http)
    first = int(plain["tokens"][0])
    assert _first_id(http, logit_bias=[[first, False]]) != first  # llama-server's pairs, false bans
    assert _first_id(http, logit_bias={str(first): -100}) != first  # OpenAI's object of token ids
    favoured = int(http.post("/tokenize", json={"content": " banana"}).json()["tokens"][-1])
    assert _first_id(http, logit_bias=[[favoured, 100]]) == favoured
    assert _first_id(http, logit_bias={str(favoured): 100}) == favoured
    # a text: every token it is split into (llama-server's object keys that are not integers)
    word = plain["content"].split()[0] if plain["content"].split() else plain["content"]
    banned = _complete(http, logit_bias={word: False})
    assert word not in banned["content"], (word, banned["content"])
    assert _complete(http)["content"] == plain["content"], "a bias of one request leaks into the next"


def test_openai_doors_take_it_too(engine: Engine) -> None:
    http = engine.http
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    first = int(http.post("/tokenize", json={"content": PROMPT + plain}).json()["tokens"][
        len(http.post("/tokenize", json={"content": PROMPT}).json()["tokens"])])
    biased = http.post("/v1/completions", json={**body, "logit_bias": {str(first): -100}}).json()["choices"][0]["text"]
    assert biased != plain
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0}
    said = http.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    banned = {w: False for w in said.split()[:1]}
    other = http.post("/v1/chat/completions", json={**chat, "logit_bias": banned}).json()
    assert other["choices"][0]["message"]["content"] != said, other


@pytest.mark.parametrize("bias, why", [
    ([[10**6, 1.0]], "vocabulary"), ({"x": "high"}, "finite"),
    ([[1]], "pair"), ("nope", "object"), ([[1, 1e9]], "finite"), ({str(i): 1 for i in range(1025)}, "1024"),
    ({"": 1}, "1 to 256")])
def test_a_bias_that_cannot_be_taken_is_refused_by_name(engine: Engine, bias: Any, why: str) -> None:
    r = engine.http.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and why in err["message"], err
    assert engine.http.post("/completion", json={"prompt": PROMPT, "n_predict": 1}).status_code == 200


def test_the_front_door_carries_it_over_the_bus(solo_pool: tuple[Coordinator, Engine]) -> None:
    c, e = solo_pool
    body = {"model": "smollm2-135m", "prompt": PROMPT, "n_predict": 4, "temperature": 0, "return_tokens": True}
    first = int(c.http.post("/completion", json=body).json()["tokens"][0])
    for bias in ([[first, False]], {str(first): -100}):
        at_front = c.http.post("/completion", json={**body, "logit_bias": bias}).json()
        at_engine = e.http.post("/completion", json={**body, "logit_bias": bias}).json()
        assert int(at_front["tokens"][0]) != first and at_front["tokens"] == at_engine["tokens"], (at_front, at_engine)
    r = c.http.post("/v1/chat/completions", json={"model": "smollm2-135m", "max_tokens": 1,
                                                  "messages": [{"role": "user", "content": "hi"}],
                                                  "logit_bias": [[10**6, 1]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text

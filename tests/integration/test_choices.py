"""OpenAI's ``n`` at the engine door and through the front door, on a real SmolLM2: greedy choices
are each the single answer, sampled ones differ; whole and streamed, each chunk carries its choice's
index, the usage counts the prompt once and every choice's tokens; more choices than an engine's
slots (or than 16) is a 400 naming ``n``."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine


@pytest.fixture(scope="module")
def engine(start_module_engine: Callable[..., Engine]) -> Engine:
    e = start_module_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_ctx": 2048,
                                      "n_parallel": 4})
    e.wait_ready()
    return e


def _stream(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: "):]))
            elif line == "data: [DONE]":
                out.append({"done": True})
    return out


def test_greedy_choices_are_the_single_answer_each(engine: Engine) -> None:
    _greedy(engine.http, {})


def _greedy(http: httpx.Client, model: dict[str, Any]) -> None:
    chat = {**model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
    one = http.post("/v1/chat/completions", json=chat).json()
    three = http.post("/v1/chat/completions", json={**chat, "n": 3}).json()
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == one["choices"][0]["message"]["content"] for c in three["choices"])
    assert three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert three["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    done = _stream(http, "/v1/chat/completions", {**chat, "n": 3, "stream_options": {"include_usage": True}})
    assert done[-1] == {"done": True} and done[-2]["usage"]["completion_tokens"] == three["usage"]["completion_tokens"]
    texts = {i: "".join(c["choices"][0]["delta"].get("content") or "" for c in done[:-2]
                        if c.get("choices") and c["choices"][0]["index"] == i) for i in range(3)}
    assert set(texts.values()) == {one["choices"][0]["message"]["content"]}
    finishes = [c["choices"][0]["index"] for c in done[:-2] if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]
    assert len({c["id"] for c in done[:-1]}) == 1


def test_choices_of_a_prepared_request_share_its_preparation(engine: Engine) -> None:
    """A chat of more than 64 messages is prepared off the engine thread: once, for all its choices."""
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"note {i}"} for i in range(65)]
    chat = {"messages": many, "max_tokens": 6, "temperature": 0}
    one = engine.http.post("/v1/chat/completions", json=chat).json()
    two = engine.http.post("/v1/chat/completions", json={**chat, "n": 2}).json()
    assert [c["message"]["content"] for c in two["choices"]] == [one["choices"][0]["message"]["content"]] * 2, two
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]


def test_sampled_choices_differ_and_completions_take_n_too(engine: Engine) -> None:
    http = engine.http
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.2, "n": 4}
    r = http.post("/v1/completions", json=body).json()
    texts = [c["text"] for c in r["choices"]]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3] and len(set(texts)) > 1, texts
    streamed = _stream(http, "/v1/completions", body)
    assert {c["choices"][0]["index"] for c in streamed if c.get("choices")} == {0, 1, 2, 3}


def test_too_many_choices_are_refused_by_name(engine: Engine) -> None:
    for n in (5, 17, 0):
        r = engine.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    r = engine.http.post("/completion", json={"prompt": "hi", "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_choices_through_the_front_door(solo_pool: tuple[Coordinator, Engine]) -> None:
    pool, _ = solo_pool
    """Each choice is a request of its own over the bus, routed and answered as one."""
    _greedy(pool.http, {"model": "smollm2-135m"})
    r = pool.http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Once upon a time",
                                                "max_tokens": 12, "temperature": 1.2, "n": 3})
    assert r.status_code == 200 and len({c["text"] for c in r.json()["choices"]}) > 1, r.text
    assert r.headers["x-hydra-engine"] == "solo"

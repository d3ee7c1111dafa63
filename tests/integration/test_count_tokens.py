"""Token counts without generating, on a real SmolLM2: Anthropic's ``/v1/messages/count_tokens`` and
llama-server's ``/v1/chat/completions/input_tokens`` (also without ``/v1``, as llama-server serves it) give the
``prompt_tokens`` the same request reports when it generates (tools and system prompt included), at the engine door and through the
front door, and a malformed body is refused naming the field (in Anthropic's error shape there)."""

from __future__ import annotations

from typing import Any, Callable

import httpx

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

TOOL = {"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_TOOL = {"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                              "parameters": TOOL["input_schema"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris today?"}]


def _counts(http: httpx.Client, model: dict[str, Any]) -> None:
    body = {**model, "messages": ASK, "system": "You are terse."}
    counted = http.post("/v1/messages/count_tokens", json=body)
    assert counted.status_code == 200, counted.text
    usage = http.post("/v1/messages", json={**body, "max_tokens": 1}).json()["usage"]
    used = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)  # computed + reused: the whole prompt
    assert counted.json() == {"input_tokens": used} and used > 10
    with_tools = http.post("/v1/messages/count_tokens", json={**body, "tools": [TOOL]}).json()["input_tokens"]
    assert with_tools > used, "the tools are rendered into the prompt, and counted"
    chat = {**model, "messages": [{"role": "system", "content": "You are terse."}, *ASK], "tools": [CHAT_TOOL]}
    counted = http.post("/v1/chat/completions/input_tokens", json=chat)
    assert counted.status_code == 200, counted.text
    used = http.post("/v1/chat/completions", json={**chat, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert counted.json() == {"input_tokens": used}
    # llama-server's paths without /v1 count the same, and /v1/health is /health
    assert http.post("/chat/completions/input_tokens", json=chat).json() == {"input_tokens": used}
    responses = {**model, "input": "What is the weather in Paris today?"}
    v1 = http.post("/v1/responses/input_tokens", json=responses)
    assert v1.status_code == 200 and http.post("/responses/input_tokens", json=responses).json() == v1.json()
    plain = http.post("/responses", json={**responses, "max_output_tokens": 1})
    assert plain.status_code == 200 and plain.json()["object"] == "response", plain.text
    assert http.get("/v1/health").status_code == 200
    bad = http.post("/v1/messages/count_tokens", json={**model, "messages": "nope"})
    assert bad.status_code == 400 and bad.json()["type"] == "error", bad.text
    assert bad.json()["error"]["type"] == "invalid_request_error" and "messages" in bad.text
    bad = http.post("/v1/chat/completions/input_tokens", json={**model, "messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"], bad.text


def test_counts_at_the_engine_door(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_ctx": 2048})
    e.wait_ready()
    _counts(e.http, {})


def test_counts_through_the_front_door(solo_pool: tuple[Coordinator, Engine]) -> None:
    pool, _ = solo_pool
    _counts(pool.http, {"model": "smollm2-135m"})

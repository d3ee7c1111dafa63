"""OpenAI's Responses API on a real SmolLM2, at the engine door and through the front door: a
response is the chat completion it stands for (the same greedy text, the same prompt tokens), whole
or streamed as typed events whose final response equals the whole one; tool calls come back as
function_call items and go in again as function_call / function_call_output items; what needs
state the engine does not keep is refused by name."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx

from tests.integration.test_tools import HERMES
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _events(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == kind, (kind, data)
                out.append(data)
    return out


def _text(resp: dict[str, Any]) -> str:
    return "".join(p["text"] for item in resp["output"] if item["type"] == "message" for p in item["content"])


def _check(http: httpx.Client, model: dict[str, Any]) -> None:
    body = {**model, "instructions": "You are terse.", "input": "Name three colours.", "max_output_tokens": 12,
            "temperature": 0}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    resp = r.json()
    assert resp["object"] == "response" and resp["id"].startswith("resp_") and resp["status"] in ("completed", "incomplete")
    chat = http.post("/v1/chat/completions", json={**model, "max_tokens": 12, "temperature": 0, "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]}).json()
    assert _text(resp) == chat["choices"][0]["message"]["content"]
    assert resp["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert resp["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]
    assert (resp["status"] == "incomplete") == (chat["choices"][0]["finish_reason"] == "length")
    events = _events(http, body)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{resp['status']}"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert deltas == _text(final) == _text(resp)
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.content_part.done", "response.output_item.done"} <= set(kinds)
    counted = http.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 200 and counted.json() == {"input_tokens": resp["usage"]["input_tokens"]}, counted.text
    for field, value in (("previous_response_id", "resp_1"), ("background", True), ("tools", [{"type": "web_search"}]),
                         ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                         ("bogus", 1)):
        bad = http.post("/v1/responses", json={**body, field: value})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith(field if field != "tools" else "tools"), \
            (field, bad.text)


def test_responses_at_the_engine_door(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_ctx": 2048})
    e.wait_ready()
    _check(e.http, {})


def test_function_calls_go_out_and_back_in(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_ctx": 2048,
                               "chat_template": HERMES})
    e.wait_ready()
    ask = {"input": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [TOOL],
           "tool_choice": "required", "max_output_tokens": 64}
    resp = e.http.post("/v1/responses", json=ask).json()
    calls = [item for item in resp["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]).get("city"), resp
    streamed = _events(e.http, ask)
    done_calls = [ev["item"] for ev in streamed if ev["type"] == "response.output_item.done"
                  and ev["item"]["type"] == "function_call"]
    assert [c["name"] for c in done_calls] == ["get_weather"] and done_calls[0]["arguments"] == calls[0]["arguments"]
    follow = {"input": [*ask["input"], calls[0], {"type": "function_call_output", "call_id": calls[0]["call_id"],
                                                 "output": "21 degrees, clear sky"}],
              "tools": [TOOL], "max_output_tokens": 16}
    after = e.http.post("/v1/responses", json=follow)
    assert after.status_code == 200 and after.json()["output"], after.text


def test_responses_through_the_front_door(solo_pool: tuple[Coordinator, Engine]) -> None:
    pool, _ = solo_pool
    _check(pool.http, {"model": "smollm2-135m"})

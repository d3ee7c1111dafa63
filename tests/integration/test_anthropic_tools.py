"""Tool use on Anthropic's Messages API, on a real engine (SmolLM2) and through the front door: a
call forced by ``tool_choice`` (any, or a named tool) is a ``tool_use`` block whose input fits its
``input_schema`` and the same call as the equivalent chat completion's; the stream carries it as
``input_json_delta``; a ``tool_result`` turn gets a text answer; ``none`` is text; bad tool fields
are a 400 naming the field. And ``/apply-template`` with tools renders the chat path's prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.integration.test_anthropic import check_refusal, stream_events
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

CITIES = ["Paris", "London", "Tokyo"]
WEATHER = {"name": "get_weather", "description": "The current weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "enum": CITIES}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "The local time in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                         "required": ["city"], "additionalProperties": False}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
ONE = {"disable_parallel_tool_use": True}


def openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                             "parameters": tool["input_schema"]}}


def ask(http: httpx.Client, **kw: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": "smollm2-135m", "max_tokens": 60, "temperature": 0, "messages": ASK, **kw}
    return http.post("/v1/messages", json=body)


def fits(tool: dict[str, Any], given: Any) -> None:
    schema = tool["input_schema"]
    assert isinstance(given, dict) and set(given) == set(schema["required"]), given
    for key, value in given.items():
        assert value in schema["properties"][key]["enum"], (key, value)


def called(r: httpx.Response, name: str | None = None) -> dict[str, Any]:
    """The one tool_use block of an answer that must call, checked against its tool."""
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["stop_reason"] == "tool_use" and m["stop_sequence"] is None, m
    uses = [b for b in m["content"] if b["type"] == "tool_use"]
    assert len(uses) == 1 and m["content"][-1] is not None and m["content"][-1]["type"] == "tool_use", m
    use = uses[0]
    assert use["id"].startswith("toolu_") and set(use) == {"type", "id", "name", "input"}, use
    assert name is None or use["name"] == name, use
    fits(next(t for t in TOOLS if t["name"] == use["name"]), use["input"])
    return use


def streamed_calls(http: httpx.Client, **kw: Any) -> tuple[str, list[dict[str, Any]], str]:
    """Text, calls (input assembled from partial_json) and stop_reason of a streamed answer, checking
    the blocks open and close in order."""
    body = {"model": "smollm2-135m", "max_tokens": 60, "temperature": 0, "messages": ASK, **kw}
    evs = stream_events(http, body)
    names = [n for n, _ in evs]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    text, calls, open_index = "", [], None
    for name, ev in evs:
        if name == "content_block_start":
            assert open_index is None and ev["index"] == len(calls) + (1 if text else 0), evs
            open_index = ev["index"]
            if ev["content_block"]["type"] == "tool_use":
                assert ev["content_block"]["input"] == {}, ev
                calls.append({**ev["content_block"], "json": ""})
        elif name == "content_block_delta":
            assert ev["index"] == open_index, evs
            if ev["delta"]["type"] == "input_json_delta":
                calls[-1]["json"] += ev["delta"]["partial_json"]
            else:
                text += ev["delta"]["text"]
        elif name == "content_block_stop":
            assert ev["index"] == open_index, evs
            open_index = None
    out = [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": json.loads(c["json"])} for c in calls]
    return text, out, evs[-2][1]["delta"]["stop_reason"]


def round_trip(http: httpx.Client) -> None:
    use = called(ask(http, tools=TOOLS, tool_choice={"type": "any", **ONE}))
    # the very call the equivalent chat completion makes
    chat = http.post("/v1/chat/completions", json={
        "model": "smollm2-135m", "max_tokens": 60, "temperature": 0, "messages": ASK,
        "tools": [openai_tool(t) for t in TOOLS], "tool_choice": "required"}).json()
    twin = chat["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (use["name"], use["input"]) == (twin["name"], json.loads(twin["arguments"]))
    text, calls, reason = streamed_calls(http, tools=TOOLS, tool_choice={"type": "any", **ONE})
    assert reason == "tool_use" and text == "" and len(calls) == 1, calls
    assert (calls[0]["name"], calls[0]["input"]) == (use["name"], use["input"])
    named = called(ask(http, tools=TOOLS, tool_choice={"type": "tool", "name": "get_time", **ONE}), "get_time")
    _, calls, _ = streamed_calls(http, tools=TOOLS, tool_choice={"type": "tool", "name": "get_time", **ONE})
    assert calls[0]["input"] == named["input"]
    # the result goes back; the model answers in text
    history = [*ASK, {"role": "assistant", "content": [use]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                             "content": [{"type": "text", "text": "21 degrees, clear sky"}]}]}]
    answer = ask(http, messages=history, tools=TOOLS, tool_choice={"type": "none"})
    assert answer.status_code == 200, answer.text
    a = answer.json()
    assert a["stop_reason"] in ("end_turn", "max_tokens") and [b["type"] for b in a["content"]] == ["text"], a
    assert a["content"][0]["text"]
    auto = ask(http, messages=history, tools=TOOLS).json()  # auto: text or another call, well formed
    assert auto["content"] and auto["stop_reason"] in ("end_turn", "max_tokens", "tool_use"), auto
    failed = [*history[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                          "content": "no such city", "is_error": True}]}]
    assert ask(http, messages=failed, tools=TOOLS, max_tokens=8).status_code == 200
    plain = ask(http, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=16).json()
    assert [b["type"] for b in plain["content"]] == ["text"] and plain["stop_reason"] != "tool_use", plain
    text, calls, reason = streamed_calls(http, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=16)
    assert calls == [] and text == plain["content"][0]["text"] and reason == plain["stop_reason"]
    many = ask(http, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=120).json()  # parallel allowed
    assert many["stop_reason"] == "tool_use", many
    for b in many["content"]:
        if b["type"] == "tool_use":
            fits(next(t for t in TOOLS if t["name"] == b["name"]), b["input"])


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": {"name": "get_weather"}}, "tools"),
    ({"tools": [WEATHER, {"name": "f"}]}, "tools[1].input_schema"),
    ({"tools": [WEATHER, {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}]},
     "tools[1].input_schema"),
    ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_stock"}}, "tool_choice.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
]


def refusals(http: httpx.Client) -> None:
    for fields, name in REFUSED:
        check_refusal(ask(http, **fields), 400, name)
    r = ask(http, stream=True, tools=[{"name": "f"}])
    check_refusal(r, 400, "tools[0].input_schema")  # before the stream starts: a real status


def apply_template(http: httpx.Client, engine: httpx.Client) -> None:
    """/apply-template with tools: the prompt names the tools and is what the chat path generates
    from (its token count is the chat completion's prompt_tokens)."""
    fields = {"messages": ASK, "tools": [openai_tool(t) for t in TOOLS], "tool_choice": "required"}
    r = http.post("/apply-template", json=fields)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "get_weather" in prompt and "get_time" in prompt and "What is the weather" in prompt
    bare = http.post("/apply-template", json={"messages": ASK}).json()["prompt"]
    assert "get_weather" not in bare and prompt != bare
    assert http.post("/apply-template", json={**fields, "tool_choice": "none"}).json()["prompt"] == bare
    tokens = engine.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    chat = http.post("/v1/chat/completions", json={**fields, "max_tokens": 1, "temperature": 0}).json()
    assert chat["usage"]["prompt_tokens"] == len(tokens), (chat["usage"], len(tokens))
    bad = http.post("/apply-template", json={**fields, "tools": [{"type": "function", "function": {"name": "a b"}}]})
    assert bad.status_code == 400 and "tools[0].function.name" in bad.text, bad.text


def test_engine_messages_with_tools(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    round_trip(http)
    refusals(http)
    apply_template(http, http)
    assert ask(http, max_tokens=4).status_code == 200  # still serving
    smollm_engine.assert_running()


def test_a_tool_aware_template_on_messages_and_apply_template(smollm_path: Path,
                                                             start_engine: Callable[..., Engine]) -> None:
    """An engine whose chat_template speaks Hermes: a forced Messages call is read from its
    <tool_call> tags, and /apply-template renders the tools through the template as the chat path."""
    from tests.integration.test_tools import HERMES
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "chat_template": HERMES})
    e.wait_ready()
    use = called(ask(e.http, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather", **ONE}), "get_weather")
    _, calls, reason = streamed_calls(e.http, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather", **ONE})
    assert reason == "tool_use" and [c["input"] for c in calls] == [use["input"]]
    history = [*ASK, {"role": "assistant", "content": [use]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "21 C"}]}]
    assert ask(e.http, messages=history, tools=TOOLS, tool_choice={"type": "none"}).status_code == 200
    fields = {"messages": ASK, "tools": [openai_tool(t) for t in TOOLS]}
    prompt = e.http.post("/apply-template", json=fields).json()["prompt"]
    assert "<tools>" in prompt and '"get_weather"' in prompt, prompt
    tokens = e.http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    chat = e.http.post("/v1/chat/completions", json={**fields, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == len(tokens)
    e.assert_running()




def test_front_door_messages_with_tools(solo_pool: tuple[Coordinator, Engine]) -> None:
    c, e = solo_pool
    round_trip(c.http)
    direct = ask(e.http, tools=TOOLS, tool_choice={"type": "any", **ONE}).json()
    via = ask(c.http, tools=TOOLS, tool_choice={"type": "any", **ONE}).json()
    assert [(b["name"], b["input"]) for b in via["content"]] == [(b["name"], b["input"]) for b in direct["content"]]
    refusals(c.http)
    apply_template(c.http, e.http)
    c.assert_running()
    e.assert_running()

"""Tool use on the Messages API: the request makes the very GenRequest of the equivalent OpenAI chat
completion with tools, bad shapes are refused naming the field as the client wrote it, and calls
come back as tool_use blocks, whole and streamed (also from the front door's OpenAI stream)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from hydrad.wire import anthropic as A
from hydrad.wire import events as E
from hydrad.wire import openai
from hydrad.wire.render import anthropic as R
from hydrad.wire.openai import ApiError
from hydrad.wire.toolcalls import ToolCall

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "Weather now", "input_schema": SCHEMA},
         {"name": "lookup", "input_schema": {"type": "object"}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                                  "parameters": SCHEMA}},
                {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": [{"type": "text", "text": "sunny"}]},
                                 {"type": "text", "text": "Thanks"}]},
]
OPENAI_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "sunny"},
    {"role": "user", "content": "Thanks"},
]


def enc(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def same(a: Any, b: Any) -> bool:
    return dataclasses.replace(a, id=0) == dataclasses.replace(b, id=0)


@pytest.mark.parametrize("choice, openai_fields", [
    (None, {"parallel_tool_calls": True}),
    ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto"}),
    ({"type": "any"}, {"tool_choice": "required", "parallel_tool_calls": True}),
    ({"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
     {"tool_choice": {"type": "function", "function": {"name": "lookup"}}}),
    ({"type": "none"}, {"tool_choice": "none"}),
])
def test_the_same_request_as_the_chat_completion_with_tools(choice: Any, openai_fields: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"tools": TOOLS} if choice is None else {"tools": TOOLS, "tool_choice": choice}
    _, gen = A.parse(enc({"max_tokens": 8, "messages": HISTORY, **fields}))
    _, chat = openai.parse("chat", enc({"max_tokens": 8, "messages": OPENAI_HISTORY, "tools": OPENAI_TOOLS,
                                        **openai_fields}))
    assert same(gen, chat), (gen, chat)


def test_an_error_result_says_so() -> None:
    body = {"max_tokens": 8, "tools": TOOLS, "messages": [*HISTORY[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True}]}]}
    _, gen = A.parse(enc(body))
    assert gen.messages[-1] == {"role": "tool", "content": "Error: no such city", "tool_call_id": "toolu_1",
                                "name": "get_weather"}


@pytest.mark.parametrize("fields, param", [
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [TOOLS[0], {"name": "g"}]}, "tools[1].input_schema"),
    ({"tools": [TOOLS[0], {"name": "g", "input_schema": {"type": "string"}}]}, "tools[1].input_schema"),
    ({"tools": [{"name": "bad name", "input_schema": SCHEMA}]}, "tools[0].name"),
    ({"tools": [{"name": "f", "description": 3, "input_schema": SCHEMA}]}, "tools[0].description"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].name"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}]},
     "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": SCHEMA, "strict": True}]}, "tools[0].strict"),
    ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tools": TOOLS, "tool_choice": {"type": "none", "disable_parallel_tool_use": True}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [HISTORY[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                  "input": "x"}]}, HISTORY[0]]},
     "messages[1].content[0].input"),
    ({"messages": [HISTORY[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "a b",
                                                                  "input": {}}]}, HISTORY[0]]},
     "messages[1].content[0].name"),
    ({"messages": [HISTORY[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t" * 300, "name": "f",
                                                                  "input": {}}]}, HISTORY[0]]},
     "messages[1].content[0].id"),
    ({"messages": [*HISTORY[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                               "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0].type"),
    ({"messages": [*HISTORY[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                               "is_error": 1}]}]},
     "messages[2].content[0].is_error"),
])
def test_bad_tool_fields_are_refused_by_their_anthropic_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as exc:
        A.parse(enc({"max_tokens": 8, "messages": HISTORY, **fields}))
    assert exc.value.status == 400 and exc.value.param == param, (exc.value.param, exc.value.message)
    assert exc.value.message.startswith(param.rsplit(".type", 1)[0])


CALL = ToolCall("call_abc", "get_weather", '{"city": "Paris"}')


def test_answer_with_calls() -> None:
    msg = R.message("msg_1", "m", "\n", "tool_calls", None, R.usage(3, 2, 0), [CALL])
    assert msg["stop_reason"] == "tool_use"
    assert msg["content"] == [{"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}]
    msg = R.message("msg_1", "m", "Sure.", "tool_calls", None, R.usage(3, 2, 0), [CALL])
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    odd = R.message("m", "m", "", "tool_calls", None, R.usage(1, 1, 0), [ToolCall("call_x", "f", "[1")])
    assert odd["content"][0]["input"] == {"arguments": "[1"}


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(b.split("\ndata: ", 1)[1]) for b in raw.decode().split("\n\n") if b.strip()]


def check_tool_stream(evs: list[dict[str, Any]], text: str | None) -> None:
    names = [e["type"] for e in evs]
    blocks = [e["content_block"] for e in evs if e["type"] == "content_block_start"]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"], names
    assert [b["type"] for b in blocks] == (["text"] if text else []) + ["tool_use"], blocks
    assert blocks[-1] == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    parts = [e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta"
             and e["delta"]["type"] == "input_json_delta"]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    assert [e["index"] for e in evs if e["type"] == "content_block_stop"] == list(range(len(blocks)))
    assert evs[-2]["delta"]["stop_reason"] == "tool_use"


def test_stream_with_calls() -> None:
    s = R.Stream("msg_1", "m", tools=True)
    check_tool_stream(events(s.start() + s.calls([CALL]) + s.end("tool_calls", None, R.usage(1, 1, 0))), None)
    s = R.Stream("msg_1", "m", tools=True)
    check_tool_stream(events(s.start() + s.text("Sure.") + s.calls([CALL]) + s.end("tool_calls", None,
                                                                                  R.usage(1, 1, 0))), "Sure.")
    s = R.Stream("msg_1", "m", tools=True)  # no text, no call: one empty text block, as a whole answer has
    evs = events(s.start() + s.end("stop", None, R.usage(1, 1, 0)))
    assert [e["content_block"] for e in evs if e["type"] == "content_block_start"] == [{"type": "text", "text": ""}]


def test_renderer_with_calls() -> None:
    r = R.MessagesAnswer("m", tools=True, rid="msg_1")
    done = E.Done("tool_calls", E.Usage(3, 2, 0, 1.0, 1.0), "fp", "m")
    assert r.whole([E.Token("", calls=(CALL,))], done, {})["content"] == R.message(
        "x", "m", "", "tool_calls", None, {}, [CALL])["content"]
    r = R.MessagesAnswer("m", tools=True, rid="msg_2")
    check_tool_stream(events(r.head() + r.piece(E.Token("", calls=(CALL,))) + r.end(done, {})), None)

"""Anthropic's Messages API translation: requests into the chat path's GenRequest, refusals by
name, the answer and event shapes, and the front door's adapters from OpenAI chat output."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire import answering
from hydrad.wire import anthropic as A
from hydrad.wire import events as E
from hydrad.wire import openai
from hydrad.wire.render import anthropic as R
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import GenRequest

USER = [{"role": "user", "content": "Hello"}]


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def parse(**kw: Any) -> tuple[A.MessagesRequest, GenRequest]:
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 16)
    return A.parse(body(kw))


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as exc:
        A.parse(raw)
    assert exc.value.status == 400
    return exc.value


def same_request(a: GenRequest, b: GenRequest) -> bool:
    return dataclasses.replace(a, id=0) == dataclasses.replace(b, id=0)


def test_the_same_gen_request_as_the_equivalent_chat_completion() -> None:
    _, gen = parse(system="Be brief.", messages=[{"role": "user", "content": "Hi"},
                                                 {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                                                 {"role": "user", "content": [{"type": "text", "text": "Tell "},
                                                                              {"type": "text", "text": "me"}]}],
                   max_tokens=7, stop_sequences=["\n\n", "END"], temperature=0.5, top_p=0.9, top_k=40,
                   metadata={"user_id": "u1"})
    _, chat = openai.parse("chat", body({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Tell me"}],
        "max_tokens": 7, "stop": ["\n\n", "END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40}))
    assert same_request(gen, chat), (gen, chat)


def test_system_as_text_blocks_and_defaults() -> None:
    req, gen = parse(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control":
                                                               {"type": "ephemeral"}}])
    assert gen.messages == [{"role": "system", "content": "AB"}, {"role": "user", "content": "Hello"}]
    assert req.stream is False and gen.stop == [] and gen.max_tokens == 16 and gen.slot is None
    _, gen = parse(system="")
    assert gen.messages == USER
    req, _ = parse(stream=True, model="smollm2-135m", service_tier="auto", tools=[], thinking={"type": "disabled"})
    assert req.stream and req.model == "smollm2-135m"


@pytest.mark.parametrize("fields, param", [
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"logprobs": True}, "logprobs"),
    ({"stop": ["x"]}, "stop"),
    ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}, *USER]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}, *USER]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"a": 1}]}]}]},
     "messages[0].content[0].citations"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
])
def test_what_the_engine_cannot_honour_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    exc = refused(body({"messages": USER, "max_tokens": 8, **fields}))
    assert exc.param == param and exc.code in ("unsupported_field", "unsupported_content"), (exc.param, exc.message)
    assert param.split(".")[-1].split("[")[0] in exc.message or "type" in exc.message


@pytest.mark.parametrize("raw, param", [
    (b"{not json", None), (b"[1, 2]", None), (b'"x"', None), (b"", None), (b'{"a": "\\ud800"}', None),
    (body({"messages": USER}), "max_tokens"),
    (body({"messages": USER, "max_tokens": 0}), "max_tokens"),
    (body({"messages": USER, "max_tokens": -3}), "max_tokens"),
    (body({"messages": USER, "max_tokens": 2**40}), "max_tokens"),
    (body({"max_tokens": 5}), "messages"),
    (body({"messages": [], "max_tokens": 5}), "messages"),
    (body({"messages": "hi", "max_tokens": 5}), "messages"),
    (body({"messages": [{"role": "system", "content": "x"}], "max_tokens": 5}), "messages[0].role"),
    (body({"messages": [{"role": "user"}], "max_tokens": 5}), "messages[0].content"),
    (body({"messages": [{"role": "user", "content": 5}], "max_tokens": 5}), "messages[0].content"),
    (body({"messages": [{"role": "user", "content": [5]}], "max_tokens": 5}), "messages[0].content[0]"),
    (body({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 5}),
     "messages[0].content[0].text"),
    (body({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "max_tokens": 5}),
     "messages[1]"),
    (body({"messages": USER, "max_tokens": 5, "temperature": 1.5}), "temperature"),
    (body({"messages": USER, "max_tokens": 5, "top_p": -1}), "top_p"),
    (body({"messages": USER, "max_tokens": 5, "top_k": "many"}), "top_k"),
    (body({"messages": USER, "max_tokens": 5, "stop_sequences": ["a", "b", "c", "d", "e"]}), "stop_sequences"),
    (body({"messages": USER, "max_tokens": 5, "stop_sequences": ["x" * 5000]}), "stop_sequences"),
    (body({"messages": USER, "max_tokens": 5, "stop_sequences": "x"}), "stop_sequences"),
    (body({"messages": USER, "max_tokens": 5, "system": 5}), "system"),
    (body({"messages": USER, "max_tokens": 5, "model": ""}), "model"),
    (body({"messages": USER, "max_tokens": 5, "model": "a\nb"}), "model"),
    (body({"messages": USER, "max_tokens": 5, "metadata": "x"}), "metadata"),
    (body({"messages": USER, "max_tokens": 5, "stream": "sometimes"}), "stream"),
])
def test_malformed_bodies_are_400s(raw: bytes, param: str | None) -> None:
    exc = refused(raw)
    if param is not None:
        assert exc.param == param, (exc.param, exc.message)
    err = R.error_of(exc)
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error" and err["error"]["message"]


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                        ["model", "max_tokens", "messages", "system", "role", "content", "type", "text", "stream",
                         "stop_sequences", "tools", "x"]), c, max_size=5), max_leaves=20))
def test_any_json_is_parsed_or_refused_with_a_400(value: Any) -> None:
    try:
        A.parse(json.dumps(value).encode())
    except ApiError as exc:
        assert exc.status == 400 and exc.message


def test_answer_shape_and_stop_reasons() -> None:
    counts = R.usage(20, 5, 12)
    assert counts == {"input_tokens": 8, "output_tokens": 5, "cache_read_input_tokens": 12}
    msg = R.message("msg_1", "m", "Hi", "stop", None, counts)
    assert msg == {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": counts}
    assert R.stop_reason("length", None) == ("max_tokens", None)
    assert R.stop_reason("stop", "END") == ("stop_sequence", "END")
    assert R.stop_reason("length", "END") == ("max_tokens", None)
    assert R.new_id().startswith("msg_") and R.new_id() != R.new_id()


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        data = json.loads(data_line[len("data: "):])
        assert data["type"] == name_line[len("event: "):]
        out.append((data["type"], data))
    return out


def test_stream_event_sequence() -> None:
    s = R.Stream("msg_1", "m")
    raw = s.start() + s.text("Hel") + s.text("lo") + s.end("stop", "END", R.usage(3, 2, 0))
    evs = events(raw)
    assert [n for n, _ in evs] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                   "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert start["id"] == "msg_1" and start["content"] == [] and start["stop_reason"] is None
    assert evs[1][1]["content_block"] == {"type": "text", "text": ""}
    assert "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta") == "Hello"
    assert evs[6][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert evs[6][1]["usage"]["output_tokens"] == 2
    err = events(R.stream_error(503, "busy"))
    assert err == [("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})]


def test_error_types() -> None:
    for status, kind in ((400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
                         (413, "request_too_large"), (409, "invalid_request_error"), (500, "api_error"),
                         (502, "api_error"), (503, "overloaded_error")):
        assert R.error_body(status, "m")["error"]["type"] == kind, status


def _done(reason: str, stop_word: str | None = None, prompt: int = 5, completion: int = 2,
          cached: int = 0) -> E.Done:
    return E.Done(reason, E.Usage(prompt, completion, cached, 1.0, 1.0), "fp", "m", stop_word=stop_word)


def test_whole_answer_from_events() -> None:
    r = R.MessagesAnswer("m", rid="msg_2")
    msg = r.whole([E.Token("Hi"), E.Token(" there")], _done("length", prompt=10, completion=4, cached=9), {})
    assert msg["content"] == [{"type": "text", "text": "Hi there"}] and msg["stop_reason"] == "max_tokens"
    assert msg["usage"] == {"input_tokens": 1, "output_tokens": 4, "cache_read_input_tokens": 9}
    assert r.whole([E.Token("x")], _done("stop", "\n"), {})["stop_reason"] == "stop_sequence"


def test_stream_from_events() -> None:
    async def drive(first: E.Event, rest: list[E.Event]) -> bytes:
        class Source:
            def __init__(self) -> None:
                self.left = list(rest)
                self.closed = False

            async def next(self) -> E.Event:
                return self.left.pop(0)

            def ready(self) -> bool:
                return bool(self.left)

            def extra(self) -> dict[str, Any]:
                return {}

            def close(self) -> None:
                self.closed = True

        return b"".join([w async for w in answering.stream(Source(), R.MessagesAnswer("m", rid="msg_3"), first)])

    out = asyncio.run(drive(E.Token("Hi"), [E.Token(" you"), _done("stop")]))
    evs = events(out)
    assert [n for n, _ in evs] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                   "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert evs[6][1]["delta"]["stop_reason"] == "end_turn" and evs[6][1]["usage"]["input_tokens"] == 5
    out = asyncio.run(drive(E.Token("Hi"), [E.Failed("engine e failed mid-stream", True, 502, "engine_failed")]))
    names = [n for n, _ in events(out)]
    assert names[-1] == "error" and "message_stop" not in names

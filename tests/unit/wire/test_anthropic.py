"""Anthropic's Messages API translation: requests into the chat path's GenRequest, refusals by
name, the answer and event shapes, and the front door's adapters from OpenAI chat output."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire import anthropic as A
from hydrad.wire import openai
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
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"logprobs": True}, "logprobs"),
    ({"stop": ["x"]}, "stop"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
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
    err = A.error_of(exc)
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
    counts = A.usage(20, 5, 12)
    assert counts == {"input_tokens": 8, "output_tokens": 5, "cache_read_input_tokens": 12}
    msg = A.message("msg_1", "m", "Hi", "stop", None, counts)
    assert msg == {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": counts}
    assert A.stop_reason("length", None) == ("max_tokens", None)
    assert A.stop_reason("stop", "END") == ("stop_sequence", "END")
    assert A.stop_reason("length", "END") == ("max_tokens", None)
    assert A.new_id().startswith("msg_") and A.new_id() != A.new_id()


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
    s = A.Stream("msg_1", "m")
    raw = s.start() + s.text("Hel") + s.text("lo") + s.end("stop", "END", A.usage(3, 2, 0))
    evs = events(raw)
    assert [n for n, _ in evs] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                   "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert start["id"] == "msg_1" and start["content"] == [] and start["stop_reason"] is None
    assert evs[1][1]["content_block"] == {"type": "text", "text": ""}
    assert "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta") == "Hello"
    assert evs[6][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert evs[6][1]["usage"]["output_tokens"] == 2
    err = events(A.stream_error(503, "busy"))
    assert err == [("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})]


def test_error_types() -> None:
    for status, kind in ((400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
                         (413, "request_too_large"), (409, "invalid_request_error"), (500, "api_error"),
                         (502, "api_error"), (503, "overloaded_error")):
        assert A.error_body(status, "m")["error"]["type"] == kind, status


def test_from_openai_body() -> None:
    body = openai.full_response("chat", "chatcmpl-1", "m", "Hi there", "length",
                                {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                                 "prompt_tokens_details": {"cached_tokens": 9}}, "fp", {})
    msg = A.from_openai(body, "msg_2", None)
    assert msg["content"] == [{"type": "text", "text": "Hi there"}] and msg["stop_reason"] == "max_tokens"
    assert msg["usage"] == {"input_tokens": 1, "output_tokens": 4, "cache_read_input_tokens": 9}
    body["choices"][0]["finish_reason"] = "stop"
    assert A.from_openai(body, "msg_2", "\n")["stop_reason"] == "stop_sequence"


def test_stream_from_openai_chunks() -> None:
    t = A.StreamFromOpenAI("msg_3", "m")
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}
    out = t.feed(openai.chunk("chat", "c", "m", 0, "", None, "fp", first=True))
    out += t.feed(openai.chunk("chat", "c", "m", 0, "Hi", None, "fp"))
    out += t.feed(openai.chunk("chat", "c", "m", 0, " you", None, "fp"))
    out += t.feed(openai.chunk("chat", "c", "m", 0, None, "stop", "fp"))
    out += t.feed(openai.usage_chunk("chat", "c", "m", 0, usage, "fp"))
    out += t.feed(openai.DONE)
    out += t.close(None)
    evs = events(out)
    assert [n for n, _ in evs] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                   "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert evs[6][1]["delta"]["stop_reason"] == "end_turn" and evs[6][1]["usage"]["input_tokens"] == 5

    broken = A.StreamFromOpenAI("msg_4", "m")
    out = broken.feed(openai.chunk("chat", "c", "m", 0, "", None, "fp", first=True) + openai.chunk(
        "chat", "c", "m", 0, "Hi", None, "fp"))
    out += broken.feed(openai.sse(ApiError(502, "engine e failed mid-stream", "engine_failed").body()) + openai.DONE)
    out += broken.close(None)
    names = [n for n, _ in events(out)]
    assert names[-1] == "error" and "message_stop" not in names
    cut = A.StreamFromOpenAI("msg_5", "m")
    assert [n for n, _ in events(cut.close(None))][-1] == "error"

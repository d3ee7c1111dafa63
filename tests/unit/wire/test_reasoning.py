"""A chat's thinking, end to end on the wire side: the splitter (markers cut anywhere, a block the
template opened, one never closed, the legacy and none formats), the request fields at the OpenAI
and Anthropic doors, the answers' shapes (whole and streamed), and the bus carrying it all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire import anthropic as A
from hydrad.wire import answering
from hydrad.wire import events as E
from hydrad.wire import messages as M
from hydrad.wire import openai
from hydrad.wire.openai import ApiError
from hydrad.wire.reasoning import ReasoningStream, opens_thinking
from hydrad.wire.render import anthropic as AR
from hydrad.wire.render import openai as OR
from hydrad.wire.requests import GenRequest

ASK = [{"role": "user", "content": "Hi"}]


def split(fmt: str, text: str, cuts: list[int] = (), opened: bool = False) -> tuple[str, str]:  # type: ignore[assignment]
    """The text fed in the pieces ``cuts`` make, the reasoning and content joined."""
    stream = ReasoningStream(fmt, opened)
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    reasoning, content = "", ""
    for lo, hi in zip(points, points[1:]):
        r, c = stream.feed(text[lo:hi])
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("fmt, text, opened, reasoning, content", [
    ("deepseek", "<think>abc</think>def", False, "abc", "def"),
    ("deepseek", "  \n<think>\n a b \n</think>\n\ndef\n", False, "a b", "def\n"),  # blank edges are not kept
    ("deepseek", "abc</think>def", True, "abc", "def"),  # the template opened the block
    ("deepseek", "\n<think>abc</think>def", True, "abc", "def"),  # ... and the model wrote the opener again
    ("deepseek", "<think>abc", False, "abc", ""),  # never closed: thinking to the end
    ("deepseek", "abc def", True, "abc def", ""),
    ("deepseek", "<think>abc</thi", False, "abc</thi", ""),  # a cut-off marker is the model's text
    ("deepseek", "Hello <think>x</think>", False, "", "Hello <think>x</think>"),  # only at the start
    ("deepseek", "<thinking>", False, "", "<thinking>"),
    ("deepseek", "<thi", False, "", "<thi"),
    ("deepseek", "", True, "", ""),
    ("deepseek-legacy", "<think>abc</think>def", False, "abc", "<think>abc</think>def"),
    ("deepseek-legacy", "abc</think>def", True, "abc", "<think>abc</think>def"),  # the template's opener in front
    ("deepseek-legacy", "<think>abc</think>def", True, "abc", "<think>abc</think>def"),  # ... not twice
    ("deepseek-legacy", "plain", False, "", "plain"),
    ("none", "<think>abc</think>def", False, "", "<think>abc</think>def"),
    ("none", "abc</think>def", True, "", "abc</think>def"),
])
def test_split_whole_and_at_every_cut(fmt: str, text: str, opened: bool, reasoning: str, content: str) -> None:
    assert split(fmt, text, opened=opened) == (reasoning, content)
    for cut in range(len(text) + 1):  # markers split across pieces anywhere
        assert split(fmt, text, [cut], opened) == (reasoning, content), cut
    assert split(fmt, text, list(range(len(text))), opened) == (reasoning, content)  # one character a piece


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="<>/thinkab \n", max_size=40), st.lists(st.integers(0, 60), max_size=6), st.booleans(),
       st.sampled_from(["deepseek", "deepseek-legacy", "none"]))
def test_any_cuts_give_the_whole_texts_answer(text: str, cuts: list[int], opened: bool, fmt: str) -> None:
    """However the text arrives, the split is the same; nothing the model wrote is lost but blank
    space at the reasoning's edges and the markers (which deepseek-legacy and none keep)."""
    whole = split(fmt, text, opened=opened)
    assert split(fmt, text, cuts, opened) == whole
    if fmt == "none":
        assert whole == ("", text)
    elif fmt == "deepseek-legacy":
        assert whole[1] in (text, "<think>" + text)


def test_content_streams_without_waiting_once_it_cannot_be_thinking() -> None:
    stream = ReasoningStream("deepseek")
    assert stream.feed("  <th") == ("", "")  # may yet be the opener: held
    assert stream.feed("e") == ("", "  <the")  # not the opener: content, as written
    assert stream.feed(" end") == ("", " end")


def test_reasoning_streams_and_holds_only_what_may_be_the_marker_or_blank() -> None:
    stream = ReasoningStream("deepseek", opened=True)
    assert stream.thinking
    assert stream.feed("\nabc ") == ("abc", "")  # leading blank dropped; trailing blank held
    assert stream.feed("def</") == (" def", "")  # the held blank goes out before more reasoning; "</" held
    assert stream.feed("think>\n\nok") == ("", "ok")
    assert not stream.thinking
    assert stream.finish() == ("", "")


def test_the_thinking_state_follows_the_block() -> None:
    stream = ReasoningStream("none")
    assert not stream.thinking
    assert stream.feed("<think>") == ("", "<think>") and stream.thinking  # none: the text back as it came
    assert stream.feed("x</think>") == ("", "x</think>") and not stream.thinking


@pytest.mark.parametrize("tail, opened", [("<|im_start|>assistant\n<think>\n", True), ("<think>", True),
                                          ("<think>\n\n</think>\n\n", False), ("assistant\n", False)])
def test_a_prompt_that_opens_the_block(tail: str, opened: bool) -> None:
    assert opens_thinking(tail) is opened


# ----- the doors' fields ------------------------------------------------------------------------

def chat(**kw: Any) -> GenRequest:
    return openai.parse("chat", json.dumps({"messages": ASK, **kw}).encode())[1]


def chat_refused(**kw: Any) -> ApiError:
    with pytest.raises(ApiError) as exc:
        chat(**kw)
    assert exc.value.status == 400
    return exc.value


def test_chat_fields_reach_the_request() -> None:
    g = chat(reasoning_format="deepseek-legacy", reasoning_budget_tokens=5, chat_template_kwargs={"enable_thinking": True})
    assert (g.reasoning_format, g.reasoning_budget, g.chat_template_kwargs) == ("deepseek-legacy", 5,
                                                                                 {"enable_thinking": True})
    g = chat()
    assert (g.reasoning_format, g.reasoning_budget, g.chat_template_kwargs) == (None, None, None)
    assert chat(reasoning_format="auto").reasoning_format is None  # llama-server's auto: the engine's default
    assert chat(reasoning_budget_tokens=-1).reasoning_budget is None  # -1: the engine's default, as llama-server
    assert chat(thinking_budget_tokens=0).reasoning_budget == 0
    assert chat(reasoning_budget=7, thinking_budget_tokens=7).reasoning_budget == 7  # the same budget twice is one
    assert chat(chat_template_kwargs={}).chat_template_kwargs is None
    assert chat(reasoning_budget_tokens=0, grammar='root ::= "a"').reasoning_budget == 0  # 0 only shapes the template


@pytest.mark.parametrize("fields, param", [
    ({"reasoning_format": "markdown"}, "reasoning_format"),
    ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": "5"}, "reasoning_budget_tokens"),
    ({"thinking_budget_tokens": 3, "reasoning_budget": 4}, "reasoning_budget"),
    ({"reasoning_budget_tokens": 3, "grammar": 'root ::= "a"'}, "reasoning_budget_tokens"),
    ({"thinking_budget_tokens": 3, "json_schema": {"type": "object"}}, "thinking_budget_tokens"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"1st": True}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {f"k{i}": i for i in range(40)}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"big": "x" * 20000}}, "chat_template_kwargs"),
])
def test_bad_chat_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    assert chat_refused(**fields).param == param


@pytest.mark.parametrize("fields", [{"chat_template_kwargs": {"a": 1}}, {"reasoning_format": "deepseek"},
                                    {"thinking_budget_tokens": 0}])
def test_completions_refuse_what_only_a_chat_has(fields: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as exc:
        openai.parse("completion", json.dumps({"prompt": "x", **fields}).encode())
    assert exc.value.param == next(iter(fields))
    openai.parse("completion", json.dumps({"prompt": "x", "reasoning_format": "none",
                                           "chat_template_kwargs": {}}).encode())  # neutral values pass


def messages(**kw: Any) -> GenRequest:
    return A.parse(json.dumps({"messages": ASK, "max_tokens": 16, **kw}).encode())[1]


def test_anthropic_thinking() -> None:
    g = messages(thinking={"type": "enabled", "budget_tokens": 10})
    assert (g.reasoning_format, g.reasoning_budget) == ("deepseek", 10)
    g = messages(thinking={"type": "disabled"})
    assert (g.reasoning_format, g.reasoning_budget) == (None, 0)  # rendered with thinking off
    g = messages()
    assert (g.reasoning_format, g.reasoning_budget) == (None, None)
    req, _ = A.parse(json.dumps({"messages": ASK, "max_tokens": 16, "thinking": {"type": "enabled",
                                                                                 "budget_tokens": 1}}).encode())
    assert A.thinks(req)
    # earlier thinking, sent back as Anthropic's clients do, is accepted and left out of the prompt
    g = messages(messages=[*ASK, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "Hello"}]}, *ASK])
    assert g.messages == [*ASK, {"role": "assistant", "content": "Hello"}, *ASK]


@pytest.mark.parametrize("thinking, param", [
    ({"type": "enabled", "budget_tokens": 16}, "thinking.budget_tokens"),  # not below max_tokens
    ({"type": "enabled", "budget_tokens": 0}, "thinking.budget_tokens"),
    ({"type": "enabled"}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": True}, "thinking.budget_tokens"),
    ({"type": "disabled", "budget_tokens": 5}, "thinking.budget_tokens"),
    ({"type": "adaptive"}, "thinking.type"),
    ({"type": "enabled", "budget_tokens": 5, "display": "x"}, "thinking.display"),
    ("on", "thinking.type"),
])
def test_anthropic_thinking_refused_by_name(thinking: Any, param: str) -> None:
    with pytest.raises(ApiError) as exc:
        messages(thinking=thinking)
    assert exc.value.status == 400 and exc.value.param == param


def test_thinking_blocks_only_in_an_assistant_turn() -> None:
    with pytest.raises(ApiError) as exc:
        messages(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}])
    assert exc.value.param == "messages[0].content[0].type"


# ----- the answers -------------------------------------------------------------------------------

def done(reason: str = "stop") -> E.Done:
    return E.Done(reason, E.Usage(5, 3, 0, 1.0, 1.0), "fp", "m")


class Source:
    def __init__(self, events: list[E.Event]) -> None:
        self.left = list(events)

    async def next(self) -> E.Event:
        return self.left.pop(0)

    def ready(self) -> bool:
        return False  # one write per event: each piece's shape is seen on its own

    def extra(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def sse(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in out.decode().split("\n\n") if line.startswith("data: {")]


PIECES = [E.Token("", reasoning="Let me"), E.Token("", reasoning=" think."), E.Token("Paris", reasoning="Done."),
          E.Token(".")]


def test_chat_answer_whole() -> None:
    body = OR.ChatAnswer("m").whole(PIECES, done(), {})
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris.",
                                             "reasoning_content": "Let me think.Done."}
    plain = OR.ChatAnswer("m").whole([E.Token("x")], done(), {})
    assert "reasoning_content" not in plain["choices"][0]["message"]  # absent, not empty, when there is none


def test_chat_answer_stream() -> None:
    out = b"".join(asyncio.run(_drain(OR.ChatAnswer("m"), PIECES)))
    deltas = [c["choices"][0]["delta"] for c in sse(out) if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": None}  # the role alone, as llama-server opens a stream
    assert deltas[1:6] == [{"reasoning_content": "Let me"}, {"reasoning_content": " think."},
                           {"reasoning_content": "Done."}, {"content": "Paris"}, {"content": "."}]
    assert deltas[-1] == {}  # the finish chunk


async def _drain(r: Any, events: list[E.Event]) -> list[bytes]:
    return [w async for w in answering.stream(Source([*events[1:], done()]), r, events[0])]


def test_messages_answer_whole() -> None:
    msg = AR.MessagesAnswer("m", thinking=True).whole(PIECES, done(), {})
    assert msg["content"] == [{"type": "thinking", "thinking": "Let me think.Done.", "signature": ""},
                              {"type": "text", "text": "Paris."}]
    # a request that did not enable thinking gets no thinking block
    assert AR.MessagesAnswer("m").whole(PIECES, done(), {})["content"] == [{"type": "text", "text": "Paris."}]


def test_messages_answer_stream() -> None:
    out = b"".join(asyncio.run(_drain(AR.MessagesAnswer("m", thinking=True), PIECES))).decode()
    evs = [json.loads(b.split("\n")[1][6:]) for b in out.split("\n\n") if b.strip()]
    names = [e["type"] for e in evs]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta", "message_stop"], names
    assert evs[2]["content_block"]["type"] == "thinking" and evs[2]["index"] == 0
    assert [e["delta"] for e in evs[3:6]] == [{"type": "thinking_delta", "thinking": t}
                                              for t in ("Let me", " think.", "Done.")]
    assert evs[7]["content_block"] == {"type": "text", "text": ""} and evs[7]["index"] == 1
    assert [e["delta"]["text"] for e in evs[8:10]] == ["Paris", "."]
    plain = b"".join(asyncio.run(_drain(AR.MessagesAnswer("m"), PIECES))).decode()
    assert "thinking" not in plain


# ----- the bus -----------------------------------------------------------------------------------

def test_tokens_carry_the_thinking_and_leave_it_out_when_there_is_none() -> None:
    msg = M.Tokens(req="g-1", texts=["Paris"], reasoning=["Let me", " think."])
    back = M.decode(M.encode(msg))
    assert isinstance(back, M.Tokens) and back.event() == E.Token("Paris", reasoning="Let me think.")
    plain = M.encode(M.Tokens(req="g-1", texts=["x"]))
    assert b"reasoning" not in plain[2]  # what an engine sent before still decodes everywhere


def test_generate_carries_the_reasoning_fields() -> None:
    gen = chat(reasoning_format="deepseek", thinking_budget_tokens=9, chat_template_kwargs={"enable_thinking": False,
                                                                                             "x": [1, {"y": None}]})
    back = M.decode(M.encode(M.Generate.from_request("gen-1", gen, "m"))).to_request()  # type: ignore[union-attr]
    assert (back.reasoning_format, back.reasoning_budget, back.chat_template_kwargs) == (
        "deepseek", 9, {"enable_thinking": False, "x": [1, {"y": None}]})
    unset = M.encode(M.Generate.from_request("gen-1", chat(), None))
    assert b"reasoning" not in unset[2] and b"chat_template_kwargs" not in unset[2]


def test_generate_with_bad_kwargs_does_not_decode() -> None:
    body = json.dumps({"req": "g-1", "messages": ASK, "chat_template_kwargs": {"tools": []}}).encode()
    with pytest.raises(M.BusDecodeError):
        M.decode([M.PROTOCOL, b"GENERATE", body])

"""The tool-call answer parser (both formats, whole and streamed piece by piece), the formats'
prompts and grammars, and the tool fields' checks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire import toolformats, tools
from hydrad.wire.grammar import check_gbnf
from hydrad.wire.toolcalls import ToolStream, delta, parse, parse_generic, parse_hermes

F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
G = {"type": "function", "function": {"name": "g"}}


def _streamed(fmt: Any, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    stream = ToolStream(fmt)
    content, calls = "", []
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for lo, hi in zip(points, points[1:]):
        more, made = stream.feed(text[lo:hi])
        content += more
        calls += made
    more, made = stream.finish()
    return content + more, [(c.name, c.arguments) for c in calls + made]


def test_hermes_calls_among_content() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>\n'
    content, calls = parse_hermes(text)
    assert content.strip() == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize(("text", "content", "calls"), [
    ("plain text", "plain text", []),
    ("a <tool_ca", "a <tool_ca", []),  # a marker that never completes is content
    ("<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    ('<tool_call>{"name": "f", "arguments": {"a": 2}}', "", [("f", '{"a": 2}')]),  # stopped before the closing tag
    ('<tool_call>{"name": "f", "arguments": {"a"', '<tool_call>{"name": "f", "arguments": {"a"', []),  # cut off
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 3}"}</tool_call>', "", [("f", '{"a": 3}')]),
])
def test_hermes_edges(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    got_content, got = parse("hermes", text)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('{"tool_call": {"name": "f", "arguments": {"a": 1}}}', "", [("f", '{"a": 1}')]),
    ('{"tool_calls": [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": [1]}}]}', "",
     [("f", "{}"), ("g", '{"b": [1]}')]),
    ('{"response": "Hello there"}', "Hello there", []),
    ('{"tool_call": {"name": "f", "argu', '{"tool_call": {"name": "f", "argu', []),  # cut by max_tokens
    ('{"tool_call": {"arguments": {}}}', '{"tool_call": {"arguments": {}}}', []),  # no name: not a call
    ("[1, 2]", "[1, 2]", []),
])
def test_generic_answers(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    got_content, got = parse_generic(text)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(["hermes", "generic"]), cuts=st.lists(st.integers(0, 400), max_size=12),
       text=st.sampled_from([
           'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
           '<tool_call>{"name": "g", "arguments": {}}</tool_call> <tool_call>{"name": "f", "arguments": {"a": 5}}</tool_call>',
           "no calls < here <tool but text", '{"tool_call": {"name": "f", "arguments": {"a": 1}}}',
           '{"response": "hi <tool_call>"}', "<tool_call>broken</tool_call>", ""]))
def test_a_stream_split_anywhere_reads_as_the_whole(fmt: Any, cuts: list[int], text: str) -> None:
    whole_content, whole_calls = parse(fmt, text)
    content, calls = _streamed(fmt, text, cuts)
    assert calls == [(c.name, c.arguments) for c in whole_calls]
    assert content.strip() == whole_content.strip()


def test_stream_entries_as_openai_streams_a_call() -> None:
    (call,) = parse_generic('{"tool_call": {"name": "f", "arguments": {"a": 1}}}')[1]
    head, args = delta([call], 2)
    assert head == {"index": 2, "id": call.id, "type": "function", "function": {"name": "f", "arguments": ""}}
    assert args == {"index": 2, "function": {"arguments": '{"a": 1}'}}


def test_format_follows_the_template() -> None:
    assert toolformats.format_for("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert toolformats.format_for("{{ messages }}") == "generic" and toolformats.format_for(None) == "generic"


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "g"}}])
@pytest.mark.parametrize("parallel", [False, True])
def test_grammars_are_usable(choice: Any, parallel: bool) -> None:
    spec = tools.parse({"tools": [F, G], "tool_choice": choice, "parallel_tool_calls": parallel})
    assert spec is not None
    for fmt in ("generic", "hermes"):
        gbnf = toolformats.grammar(fmt, spec)  # type: ignore[arg-type]
        if gbnf is None:
            assert fmt == "hermes" and choice == "auto"
            continue
        check_gbnf(gbnf)
        assert ('"\\"g\\""' in gbnf) and (('"\\"f\\""' in gbnf) == (choice != {"type": "function", "function": {"name": "g"}}))


def test_generic_history_and_instruction() -> None:
    spec = tools.parse({"tools": [F], "tool_choice": "required"})
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", **tools.message_fields({"tool_calls": [call]}, "assistant", "m")},
            {"role": "tool", "content": "42", **tools.message_fields({"tool_call_id": "c1"}, "tool", "m")}]
    out = toolformats.generic_messages(msgs, spec)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.") and '"name": "f"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "f", "arguments": {"a": 1}}}
    assert out[3] == {"role": "user", "content": json.dumps({"tool_response": {"content": "42", "id": "c1"}})}
    # without tools the history's calls are still rendered, and no instruction is added
    bare = toolformats.generic_messages(msgs, None)
    assert bare[0] == msgs[0] and json.loads(bare[2]["content"])["tool_call"]["name"] == "f"


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": {}}, "tools"),
    ({"tools": [F, {"type": "function", "function": {"name": "x" * 65}}]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": float("nan")}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools[0].function"),
    ({"tools": [F], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [F], "tool_choice": 3}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
])
def test_bad_tool_fields_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(tools.ToolError) as ei:
        tools.parse(fields)
    assert ei.value.param == param and param in str(ei.value)


def test_neutral_tool_fields_ask_for_nothing() -> None:
    for fields in ({}, {"tools": []}, {"tools": [F], "tool_choice": "none"}, {"tool_choice": "auto"},
                   {"parallel_tool_calls": True}):
        assert tools.parse(fields) is None


def test_the_bus_carries_tools_and_calls_and_checks_them_again() -> None:
    from hydrad.wire import messages as M
    from hydrad.wire.requests import GenRequest

    spec = tools.parse({"tools": [F, G], "tool_choice": {"type": "function", "function": {"name": "g"}}})
    gen = M.decode(M.encode(M.Generate.from_request("r1", GenRequest(messages=[{"role": "user", "content": "x"}],
                                                                         tools=spec), None)))
    assert isinstance(gen, M.Generate) and gen.to_request().tools == spec
    (call,) = parse_generic('{"tool_call": {"name": "f", "arguments": {}}}')[1]
    got = M.decode(M.encode(M.Tokens(req="r1", texts=[""], tool_calls=[M.ToolCall.of(call)])))
    assert isinstance(got, M.Tokens) and got.tool_calls and got.tool_calls[0].call() == call
    frames = M.encode(gen)
    for bad in (b'"function":"g"', b'"name":"g"'):
        with pytest.raises(M.BusDecodeError):
            M.decode([frames[0], frames[1], frames[2].replace(bad, bad.replace(b'"g"', b'"no such"'), 1)])


@pytest.mark.parametrize("fmt", ["generic", "hermes"])
def test_an_agents_128_tools_make_a_usable_grammar(fmt: Any) -> None:
    """128 ordinary tools (what an agent with a few MCP servers sends every turn) make a grammar of
    about 150,000 characters: longer than a client's own grammar may be, within the bound for tools."""
    from tests.support.heavy import tool

    spec = tools.parse({"tools": [tool(i) for i in range(128)], "tool_choice": "required"})
    assert spec is not None
    gbnf = toolformats.grammar(fmt, spec)
    assert gbnf is not None and len(gbnf) > 100_000
    check_gbnf(gbnf, len(gbnf))

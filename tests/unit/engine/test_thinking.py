"""A think block on the engine side: the reasoning budget's count and the end it writes for the
model, what the template is given (the engine's defaults, the request's kwargs, a budget of 0), and
those variables reaching a real jinja render."""

from __future__ import annotations

from hydrad.common.params import RuntimeParams
from hydrad.engine import chatprompt
from hydrad.engine.jinja import render
from hydrad.engine.thinking import Thinking
from hydrad.wire.reasoning import ReasoningStream
from hydrad.wire.requests import GenRequest

CLOSE = [7, 8, 9]  # the tokens of </think> (a model's own, here three made-up ids)
ASK = [{"role": "user", "content": "Hi"}]


def feed(t: Thinking, pieces: list[str]) -> list[tuple[int, list[int]]]:
    """Each piece as one token turned into text, then the budget checked: (tokens made, tokens forced)."""
    out = []
    for made, piece in enumerate(pieces, 1):
        t.split(piece, end=False)
        t.check(made)
        out.append((made, list(t.forced)))
    return out


def test_the_block_is_closed_for_the_model_after_its_budget() -> None:
    t = Thinking(ReasoningStream("deepseek", opened=True), 3, CLOSE)
    t.check(0)
    assert not t.forced
    steps = feed(t, ["a", " b", " c"])
    assert steps[-1] == (3, CLOSE) and all(not f for _, f in steps[:-1])
    t.forced.clear()
    t.split("</think>", end=False)  # the forced tokens' text ends the block
    t.check(4)
    assert not t.forced and not t.stream.thinking


def test_the_budget_counts_from_where_the_model_opens_the_block() -> None:
    t = Thinking(ReasoningStream("deepseek"), 2, CLOSE)
    assert feed(t, ["Well", "<think>", "x", "y"])[-1] == (4, [])  # not at the start: no block, nothing forced
    t = Thinking(ReasoningStream("deepseek"), 2, CLOSE)
    steps = feed(t, ["<think>", "x", "y"])
    assert [f for _, f in steps] == [[], [], CLOSE]


def test_a_budget_of_zero_closes_an_opened_block_before_the_first_token() -> None:
    t = Thinking(ReasoningStream("none", opened=True), 0, CLOSE)
    t.check(0)
    assert list(t.forced) == CLOSE


def test_a_block_the_model_closed_itself_is_left_alone_and_forcing_happens_once() -> None:
    t = Thinking(ReasoningStream("deepseek", opened=True), 3, CLOSE)
    assert [f for _, f in feed(t, ["a", "</think>", "b", "c", "d"])] == [[]] * 5
    t = Thinking(ReasoningStream("deepseek", opened=True), 1, CLOSE)
    t.check(0)
    t.split("a", end=False)
    t.check(1)
    assert list(t.forced) == CLOSE and t.spent
    t.forced.clear()
    t.split("b", end=False)  # still thinking (the forced tokens' text has not come back yet)...
    t.check(2)
    assert not t.forced  # ... and not forced twice


def test_what_the_template_is_given() -> None:
    params = RuntimeParams(default_template_kwargs={"enable_thinking": True, "persona": "a"})
    assert chatprompt.template_kwargs(GenRequest(messages=ASK), params) == {"enable_thinking": True, "persona": "a"}
    req = GenRequest(messages=ASK, chat_template_kwargs={"persona": "b"})
    assert chatprompt.template_kwargs(req, params) == {"enable_thinking": True, "persona": "b"}
    off = GenRequest(messages=ASK, reasoning_budget=0, chat_template_kwargs={"enable_thinking": True})
    assert chatprompt.template_kwargs(off, params)["enable_thinking"] is False  # a budget of 0 is thinking off
    assert chatprompt.template_kwargs(GenRequest(messages=ASK), RuntimeParams()) is None
    assert chatprompt.template_kwargs(GenRequest(messages=ASK), RuntimeParams(reasoning_budget=0)) == {
        "enable_thinking": False}
    assert chatprompt.budget(GenRequest(messages=ASK), RuntimeParams()) is None
    assert chatprompt.budget(GenRequest(messages=ASK, reasoning_budget=5), RuntimeParams(reasoning_budget=0)) == 5


def test_variables_reach_a_real_render() -> None:
    template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>{% endif %}"
                "{{ persona | default('') }}")
    assert render(template, ASK, None, "", "") == "user: Hi\n<think>"
    assert render(template, ASK, None, "", "", kwargs={"enable_thinking": False, "persona": "p"}) == (
        "user: Hi\n<think></think>p")
    # what the engine gives the template wins over a variable of the same name
    assert render(template, ASK, None, "", "", kwargs={"messages": []}) == "user: Hi\n<think>"


def test_reasoning_then_tool_calls_in_one_answer() -> None:
    """The engine thread's Token making: the thinking is split off first, the tool reader reads the
    rest, so an answer can think, then call (and a <tool_call> inside the thinking is not a call)."""
    from hydrad.engine.active import Active as _Active, token_event as _token
    from hydrad.wire.toolcalls import ToolStream

    a = _Active(handle=None, prompt_len=0, cached=0, pending=[], max_tokens=64, sampler=None,  # type: ignore[arg-type]
                detok=None, stopper=None, t_start=0.0, tools=ToolStream("hermes"),  # type: ignore[arg-type]
                think=Thinking(ReasoningStream("deepseek", opened=True), None, []))
    text = ('I should call <tool_call>{"name": "f"}</tool_call> maybe.</think>\nSure.\n'
            '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    events = [ev for piece in [text[i:i + 5] for i in range(0, len(text), 5)] if (ev := _token(a, piece))]
    if (last := _token(a, "", end=True)) is not None:
        events.append(last)
    reasoning = "".join(ev.reasoning for ev in events)
    content = "".join(ev.text for ev in events)
    calls = [c for ev in events for c in ev.calls]
    assert reasoning == 'I should call <tool_call>{"name": "f"}</tool_call> maybe.'
    assert content.strip() == "Sure." and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]
    first_call = next(i for i, ev in enumerate(events) if ev.calls)
    assert all(not ev.reasoning for ev in events[first_call:])  # thinking first, then the calls

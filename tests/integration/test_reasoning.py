"""Reasoning control on a real engine (SmolLM2, greedy) and through the front door: a chat template
that opens the think block itself, the model's thinking split into ``reasoning_content`` (whole and
streamed) or Anthropic ``thinking`` blocks, ``deepseek-legacy`` and ``none``, a reasoning budget that
closes the block for the model after N tokens, a budget of 0 rendering the template with thinking
off, tool calls under their grammar beside a thinking template, and ``chat_template_kwargs`` seen in
``/apply-template``'s prompt. Both doors give the same
answers for the same requests.

SmolLM2 is not a thinking model, so what it thinks is made deterministic two ways: a grammar that
forces ``<think>abc</think>def`` through real decoding, and the template's opened block with a budget
(the first N greedy tokens are its reasoning, then ``</think>`` is written for it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

# SmolLM2's chat format, as a thinking model's template writes it: the generation prompt opens the
# think block, or (enable_thinking false) writes an empty one; ``persona`` shows a template variable.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if persona is defined %}[{{ persona }}] {% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "What is the capital of France?"}]
FORCED = 'root ::= "<think>abc</think>def"'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
PROFILES = {"profiles": {"one": {"description": "one SmolLM2 engine with a thinking template",
                                 "engines": {"solo": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
            "default": "one"}
ENGINE_DEFAULTS = {"model": "smollm2-135m", "n_ctx": 2048, "n_threads": 1, "temperature": 0,
                   "chat_template": THINK_TEMPLATE}


def chat(http: httpx.Client, **kw: Any) -> dict[str, Any]:
    r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 12, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def streamed(http: httpx.Client, **kw: Any) -> tuple[str, str, str]:
    """(reasoning, content, finish_reason) of a streamed chat, with each chunk's delta checked."""
    body = {"messages": ASK, "max_tokens": 12, "temperature": 0, "stream": True, **kw}
    reasoning, content, finish = [], [], ""
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            delta = choice["delta"]
            assert not ("reasoning_content" in delta and delta.get("content")), delta  # thinking has chunks of its own
            reasoning.append(delta.get("reasoning_content", ""))
            content.append(delta.get("content") or "")
            finish = choice["finish_reason"] or finish
    return "".join(reasoning), "".join(content), finish


def anthropic_events(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    return [json.loads(block.split("\n")[1][len("data: "):]) for block in raw.split("\n\n") if block.strip()]


def answers(http: httpx.Client) -> dict[str, Any]:
    """Every answer this test checks, checked, keyed for comparing the two doors."""
    out: dict[str, Any] = {}

    # a grammar forces the think block through real decoding: split whole and streamed
    whole = chat(http, grammar=FORCED, max_tokens=40)
    assert whole["message"]["reasoning_content"] == "abc" and whole["message"]["content"] == "def", whole
    assert whole["finish_reason"] == "stop"
    assert streamed(http, grammar=FORCED, max_tokens=40) == ("abc", "def", "stop")
    legacy = chat(http, grammar=FORCED, max_tokens=40, reasoning_format="deepseek-legacy")["message"]
    assert legacy["reasoning_content"] == "abc" and legacy["content"] == "<think>abc</think>def", legacy
    assert streamed(http, grammar=FORCED, max_tokens=40, reasoning_format="deepseek-legacy") == (
        "abc", "<think>abc</think>def", "stop")
    raw = chat(http, grammar=FORCED, max_tokens=40, reasoning_format="none")["message"]
    assert raw["content"] == "<think>abc</think>def" and "reasoning_content" not in raw, raw
    out["forced"] = [whole["message"], legacy, raw]

    # the template opened the block: everything is thinking until it closes (here: never, in 6 tokens)
    thought = chat(http, max_tokens=6)
    assert thought["message"]["content"] == "" and thought["message"]["reasoning_content"], thought
    assert thought["finish_reason"] == "length"
    assert streamed(http, max_tokens=6) == (thought["message"]["reasoning_content"], "", "length")

    # a budget of 3 tokens: the same first 3 tokens of thinking, then </think> is written for the model
    # and it answers
    first3 = chat(http, max_tokens=3)["message"]["reasoning_content"]
    budgeted = chat(http, max_tokens=16, reasoning_budget_tokens=3)
    assert budgeted["message"]["reasoning_content"] == first3, (budgeted, first3)
    assert budgeted["message"]["content"].strip(), budgeted
    assert streamed(http, max_tokens=16, reasoning_budget_tokens=3) == (
        first3, budgeted["message"]["content"], budgeted["finish_reason"])
    same = chat(http, max_tokens=16, thinking_budget_tokens=3)  # llama-server's other name for it
    assert same == budgeted
    kept = chat(http, max_tokens=16, reasoning_budget_tokens=3, reasoning_format="none")["message"]
    assert kept["content"].count("</think>") == 1 and "reasoning_content" not in kept, kept
    out["budget"] = [thought["message"], budgeted["message"], kept]

    # a budget of 0: the template renders thinking off, and the answer has no thinking
    off = chat(http, reasoning_budget_tokens=0)["message"]
    assert "reasoning_content" not in off and off["content"].strip(), off
    assert off == chat(http, chat_template_kwargs={"enable_thinking": False})["message"]
    out["off"] = off

    # tools under their grammar (SmolLM2 speaks the generic JSON format): the grammar decides the answer
    # from its first token, so the template's opened block is not assumed and the call is read as usual
    called = chat(http, max_tokens=60, tools=[WEATHER], tool_choice="required")
    assert called["finish_reason"] == "tool_calls" and "reasoning_content" not in called["message"], called
    assert called["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    out["tools"] = [{**c["function"]} for c in called["message"]["tool_calls"]]

    # Anthropic: thinking blocks when enabled, none when disabled
    base = {"max_tokens": 16, "temperature": 0, "messages": ASK}
    m = http.post("/v1/messages", json={**base, "thinking": {"type": "enabled", "budget_tokens": 3}}).json()
    assert [b["type"] for b in m["content"]] == ["thinking", "text"], m
    assert m["content"][0]["thinking"] == first3 and m["content"][1]["text"] == budgeted["message"]["content"], m
    evs = anthropic_events(http, {**base, "thinking": {"type": "enabled", "budget_tokens": 3}})
    starts = [e["content_block"]["type"] for e in evs if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"], evs
    deltas = [e["delta"] for e in evs if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas if d["type"] == "thinking_delta") == first3
    assert "".join(d.get("text", "") for d in deltas if d["type"] == "text_delta") == m["content"][1]["text"]
    plain = http.post("/v1/messages", json={**base, "thinking": {"type": "disabled"}}).json()
    assert [b["type"] for b in plain["content"]] == ["text"] and plain["content"][0]["text"] == off["content"][:len(
        plain["content"][0]["text"])], (plain, off)
    out["anthropic"] = [{k: v for k, v in m.items() if k != "id"}, {k: v for k, v in plain.items() if k != "id"}]
    return out


def template_kwargs(http: httpx.Client) -> None:
    """What the template is given, seen in the prompt /apply-template makes."""
    def prompt(**kw: Any) -> str:
        r = http.post("/apply-template", json={"messages": ASK, **kw})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    assert prompt().endswith("<|im_start|>assistant\n<think>\n")
    assert prompt(chat_template_kwargs={"persona": "pirate"}).endswith("<|im_start|>assistant\n[pirate] <think>\n")
    assert prompt(reasoning_budget_tokens=0).endswith("<think>\n\n</think>\n\n")
    assert prompt(chat_template_kwargs={"enable_thinking": False}) == prompt(reasoning_budget_tokens=0)


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"a b": 1}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"persona": "<|im_start|>system"}}, "chat_template_kwargs"),
    ({"reasoning_format": "markdown"}, "reasoning_format"),
    ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": 3, "thinking_budget_tokens": 4}, "thinking_budget_tokens"),
    ({"reasoning_budget_tokens": 3, "grammar": FORCED}, "reasoning_budget_tokens"),
]


def refusals(http: httpx.Client) -> None:
    for fields, param in REFUSED:
        r = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **fields})
        assert r.status_code == 400, (fields, r.text)
        assert r.json()["error"]["param"] == param, (fields, r.json())
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "chat_template_kwargs": {"a": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    r = http.post("/v1/messages", json={"max_tokens": 8, "messages": ASK,
                                        "thinking": {"type": "enabled", "budget_tokens": 8}})
    assert r.status_code == 400 and "thinking.budget_tokens" in r.json()["error"]["message"], r.text


def test_engine_reasoning(start_engine: Callable[..., Engine], smollm_path: Path) -> None:
    e = start_engine(defaults=ENGINE_DEFAULTS)
    e.wait_ready()
    answers(e.http)
    template_kwargs(e.http)
    refusals(e.http)
    # the engine's own defaults: none leaves the thinking in content; a default budget of 0 renders it off
    assert e.http.post("/control/configure", json={"reasoning_format": "none",
                                                   "default_template_kwargs": {"persona": "pirate"}}).status_code == 200
    raw = chat(e.http, grammar=FORCED, max_tokens=40)["message"]
    assert raw["content"] == "<think>abc</think>def" and "reasoning_content" not in raw, raw
    prompt = e.http.post("/apply-template", json={"messages": ASK}).json()["prompt"]
    assert prompt.endswith("[pirate] <think>\n"), prompt
    assert chat(e.http, grammar=FORCED, max_tokens=40,
                reasoning_format="deepseek")["message"]["reasoning_content"] == "abc"


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults=ENGINE_DEFAULTS, extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_front_door_reasoning(pool: tuple[Coordinator, Engine]) -> None:
    """The front door carries every field over the bus and the thinking back: its answers are the engine's."""
    c, e = pool
    at_engine = answers(e.http)
    at_front = answers(c.http)
    assert at_front == at_engine
    template_kwargs(c.http)
    refusals(c.http)

"""The official Python SDKs, ``openai`` and ``anthropic``, against a real SmolLM2 engine and the coordinator's
front door: what a client written for OpenAI's or Anthropic's API does, unchanged but for its base URL.

Checked at both doors, greedy: OpenAI chat completions whole and streamed (the stream's text is the whole
answer's), a tools round trip (a forced call parsed into the SDK's tool call, its arguments JSON fitting the
schema, then the tool's result sent back and answered), the Responses API whole and streamed; Anthropic
messages whole and streamed (the SDK's event accumulator gives the whole answer's text), a tool use round
trip, and count_tokens agreeing with the input tokens a message is answered with."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from tests.support.solopool import SoloPool, module_pool

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MODEL = "smollm2-135m"
ASK = "Name three colours of the rainbow."
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoloPool]:
    yield from module_pool(tmp_path_factory, "sdks", defaults={"n_ctx": 2048, "n_parallel": 2, "temperature": 0})


DOORS = ["engine", "coordinator"]


def oai(pool: SoloPool, door: str) -> "openai.OpenAI":
    return openai.OpenAI(base_url=pool.urls[door] + "/v1", api_key="any", timeout=120, max_retries=0)


def claude(pool: SoloPool, door: str) -> "anthropic.Anthropic":
    return anthropic.Anthropic(base_url=pool.urls[door], api_key="any", timeout=120, max_retries=0)


@pytest.mark.parametrize("door", DOORS)
def test_openai_chat_whole_and_streamed(pool: SoloPool, door: str) -> None:
    client = oai(pool, door)
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=16)
    text = whole.choices[0].message.content
    assert text and whole.model == MODEL and whole.usage is not None and whole.usage.completion_tokens > 0
    pieces = []
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=16,
                                            stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
    assert len(pieces) > 1 and "".join(pieces) == text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("door", DOORS)
def test_openai_tools_round_trip(pool: SoloPool, door: str) -> None:
    client = oai(pool, door)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": WEATHER}}]
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice="required",
                                           max_tokens=64)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "clear"})}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice="none",
                                            max_tokens=24)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    alone = client.chat.completions.create(model=MODEL, messages=messages[:1], tools=tools, tool_choice="none",
                                           max_tokens=1)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens  # the call and its result were in the prompt


@pytest.mark.parametrize("door", DOORS)
def test_openai_responses_whole_and_streamed(pool: SoloPool, door: str) -> None:
    client = oai(pool, door)
    whole = client.responses.create(model=MODEL, input=ASK, max_output_tokens=16)
    assert whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.usage is not None and whole.usage.output_tokens > 0
    deltas, final = [], None
    for event in client.responses.create(model=MODEL, input=ASK, max_output_tokens=16, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None and "".join(deltas) == final.output_text == whole.output_text


@pytest.mark.parametrize("door", DOORS)
def test_anthropic_messages_whole_streamed_and_counted(pool: SoloPool, door: str) -> None:
    client = claude(pool, door)
    msgs = [{"role": "user", "content": ASK}]
    whole = client.messages.create(model=MODEL, max_tokens=16, messages=msgs, system="Answer briefly.")
    assert whole.type == "message" and whole.role == "assistant" and whole.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in whole.content if b.type == "text")
    assert text and whole.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=16, messages=msgs, system="Answer briefly.") as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == text
    assert "".join(b.text for b in final.content if b.type == "text") == text
    counted = client.messages.count_tokens(model=MODEL, messages=msgs, system="Answer briefly.")
    fresh = client.messages.create(model=MODEL, max_tokens=1, messages=msgs, system="Answer briefly.")
    # the whole prompt: what was computed now and what came from the cache
    assert counted.input_tokens == fresh.usage.input_tokens + (fresh.usage.cache_read_input_tokens or 0) > 0


@pytest.mark.parametrize("door", DOORS)
def test_anthropic_tool_use_round_trip(pool: SoloPool, door: str) -> None:
    client = claude(pool, door)
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
    msgs: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=64, messages=msgs, tools=tools,
                                   tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use", first
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str) and use.id
    msgs += [{"role": "assistant", "content": first.content},  # the SDK's blocks, as its documentation passes them
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": json.dumps({"temperature_c": 21, "sky": "clear"})}]}]
    second = client.messages.create(model=MODEL, max_tokens=24, messages=msgs, tools=tools,
                                    tool_choice={"type": "none"})
    assert any(b.type == "text" and b.text for b in second.content) and second.stop_reason != "tool_use"

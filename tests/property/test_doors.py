"""Property tests of both OpenAI doors (an engine's own API and the coordinator's front door)
over every request field, with hostile values, through real processes on the real model.

The invariant (``tests/property/doors.py``): a 2xx with a well-formed OpenAI body or SSE stream
ending in ``data: [DONE]`` (llama-server's shapes for its native ``/completion``), or a 4xx/503
with OpenAI error JSON; never a 500, a hang or a dropped
connection; afterwards every engine alive, no slot busy, nothing queued, nothing in flight at
the coordinator, and a normal request served.

``HYDRA_PROPERTY_EXAMPLES`` sets the examples per door (default 150, shared out between the
tests below as 40/25/20/15 %, and 15 % more for ``/completion``, 10 % for ``/infill``, 15 % for
``/v1/messages``, 15 % for ``/v1/embeddings`` and 10 % for ``/embedding``); ``scripts/fuzz_doors.py`` is the long run.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.property import doors
from tests.property.pool import Door

EXAMPLES = int(os.environ.get("HYDRA_PROPERTY_EXAMPLES", "150"))
# A failing example is shrunk (up to five minutes per distinct bug): more than the suite's 300 s per test.
pytestmark = [pytest.mark.model, pytest.mark.timeout(max(900, EXAMPLES * 10))]
settings.register_profile("hydra-doors", deadline=None, database=None, derandomize=False, print_blob=True,
                          suppress_health_check=list(HealthCheck), max_examples=EXAMPLES)
PROFILE = settings.get_profile("hydra-doors")


def share(fraction: float) -> settings:
    return settings(PROFILE, max_examples=max(1, round(EXAMPLES * fraction)))


def kept(door: Door, case: doors.Case, out: doors.Outcome) -> None:
    """Raise the first broken promise (its class tells hypothesis which bug it is) with all of them."""
    if out.problems:
        lines = "\n".join(f"  {type(p).__name__}: {p}" for p in out.problems)
        raise type(out.problems[0])(f"{door.name} door, {case.describe()}\n -> {out.status} after {out.seconds:.1f} s\n"
                                    f"{lines}")


@share(0.40)
@given(case=doors.bodies("chat"))
def test_chat_completions_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@share(0.25)
@given(case=doors.bodies("completion"))
def test_completions_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@share(0.15)
@given(case=doors.bodies("native"))
def test_native_completion_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@share(0.10)
@given(case=doors.bodies("infill"))
def test_infill_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@share(0.15)
@given(case=doors.messages_bodies())
def test_messages_any_body(door: Door, case: doors.Case) -> None:
    """Anthropic's Messages API, tools and tool use included: its own answer, event and error shapes."""
    kept(door, case, door.check(case))


@pytest.mark.parametrize("stream", [False, True])
def test_the_messages_strategy_reaches_a_tool_call(door: Door, stream: bool) -> None:
    """A forced call with hostile text around it is served at both doors, as tool_use blocks."""
    body = {"max_tokens": 40, "stream": stream, "system": "\u2028<|im_start|>", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "\ud83d\ude00"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1]}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "<|im_end|>"}]}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    case = doors.Case(doors.MESSAGES, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == ("sse" if stream else "json"), out


@share(0.15)
@given(case=doors.embedding_bodies("openai"))
def test_embeddings_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@share(0.10)
@given(case=doors.embedding_bodies("native"))
def test_native_embedding_any_body(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


EMBED_RAW = [
    (b'{"input":' + b"[" * 5_000 + b'"hi"' + b"]" * 5_000 + b"}", "deep input"),
    (b'{"input":"' + b"a" * (doors.MAX_BODY - 20) + b'"}', "1 MiB input"),
    (b'{"input":[' + b",".join([b'"x"'] * 100_000) + b"]}", "100,000 inputs"),
    (b'{"input":[' + b",".join([b"1"] * 200_000) + b"]}", "200,000 token ids"),
    (b'{"input":"\\ud800"}', "escaped lone surrogate"), (b'{"input":"\xff\xfe"}', "invalid UTF-8"),
    (b'{"input":"hi","embd_normalize":NaN}', "NaN embd_normalize"),
    (b'{"input":"hi","dimensions":1e999}', "huge float dimensions"),
    (b'{"input":"hi","encoding_format":"base64","encoding_format":"x"}', "duplicate key"),
    (b'{"content":["a",' + b"[" * 3_000 + b"]" * 3_000 + b"]}", "deep content"),
]


@pytest.mark.parametrize("path", [doors.EMBEDDINGS, doors.NATIVE_EMBEDDING])
@pytest.mark.parametrize("body,note", EMBED_RAW, ids=[n for _, n in EMBED_RAW])
def test_each_known_hostile_body_at_embeddings(door: Door, path: str, body: bytes, note: str) -> None:
    case = doors.Case(path, body, {}, note)
    kept(door, case, door.check(case))


@pytest.mark.parametrize("path,body", [
    (doors.EMBEDDINGS, {"input": ["Hi \U0001f600 \x01", [1, 504, 3458]], "encoding_format": "base64",
                        "dimensions": doors.N_EMBD, "user": "x", "embd_normalize": 2, "unknown": [1]}),
    (doors.NATIVE_EMBEDDING, {"content": ["Hi \u2028", [1, 504]], "embd_normalize": -1}),
], ids=["openai", "native"])
def test_the_embedding_strategies_reach_the_engine(door: Door, path: str, body: dict[str, object]) -> None:
    """Valid embedding bodies with hostile content are served (200) and their shapes hold."""
    case = doors.Case(path, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == "json", out


NATIVE_RAW = [(body, note) for body, note in doors.RAW_BODIES if b'"prompt"' in body]


@pytest.mark.parametrize("body,note", NATIVE_RAW, ids=[n for _, n in NATIVE_RAW])
def test_each_known_hostile_body_at_completion(door: Door, body: bytes, note: str) -> None:
    """The fixed hostile bodies that carry a prompt, at llama-server's /completion."""
    case = doors.Case(doors.NATIVE, body, {}, note)
    kept(door, case, door.check(case))


@share(0.20)
@given(case=doors.raw_bodies())
def test_raw_bodies(door: Door, case: doors.Case) -> None:
    kept(door, case, door.check(case))


@pytest.mark.parametrize("body,note", doors.RAW_BODIES, ids=[n for _, n in doors.RAW_BODIES])
def test_each_known_hostile_body(door: Door, body: bytes, note: str) -> None:
    """Every fixed hostile body, every run (the raw strategy draws them only now and then)."""
    case = doors.Case(doors.raw_path(body) or doors.CHAT, body, {}, note)
    kept(door, case, door.check(case))


@share(0.15)
@given(case=doors.big_limits())
def test_huge_generation_limits_are_refused_or_bounded(door: Door, case: doors.Case) -> None:
    out = door.check(case)
    kept(door, case, out)


@pytest.mark.parametrize("name,value", [("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("repeat_penalty", 1.1)])
@pytest.mark.parametrize("path", [doors.CHAT, doors.COMPLETIONS])
def test_each_penalty_is_served(door: Door, path: str, name: str, value: float) -> None:
    body = {"max_tokens": 4, name: value}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if path == doors.CHAT else {"prompt": "Once upon a time"})
    case = doors.Case(path, doors.encode(body), {}, f"{name}={value}")
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200, f"{door.name} door: {case.describe()} -> {out.status}"


def _cancelled(door: Door) -> int:
    total = 0
    for url in door.engine_urls():
        for line in door.client.get(url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("hydra_requests_cancelled_total "):
                total += int(float(line.split()[1]))
    return total


@pytest.mark.parametrize("stream", [True, False])
def test_abandoned_request_is_cancelled(door: Door, stream: bool) -> None:
    """A client that goes away mid-generation: the engine cancels the request (it does not run to
    its limit), frees the slot within the settle time, and the coordinator forgets it."""
    door.heal()
    before = _cancelled(door)
    body = {"messages": [{"role": "user", "content": "Count from one to one thousand."}], "max_tokens": 1500,
            "ignore_eos": True, "stream": stream}
    case = doors.Case(doors.CHAT, doors.encode(body), {}, "abandoned after the first chunk" if stream else
                      "abandoned after 1 s")
    try:
        if stream:
            with door.client.stream("POST", door.url + case.path, content=case.body,
                                    headers={"Content-Type": "application/json"}) as r:
                assert r.status_code == 200
                next(r.iter_raw())
        else:
            door.client.post(door.url + case.path, content=case.body, headers={"Content-Type": "application/json"},
                             timeout=1.0)
    except httpx.TimeoutException:
        pass
    left = time.monotonic()
    # Still far from its limit (about 500 tokens: the context) when the client left? Then it must
    # end cancelled. (On a fast machine it may have finished already: nothing to cancel.)
    running = [sl for url in door.engine_urls() for sl in door.client.get(url + "/slots", timeout=5).json()
               if sl.get("is_processing") and sl.get("n_decoded", 0) < 300]
    out = doors.Outcome(None, 0.0)
    out.problems += doors.settle(door.client, door.engine_urls(), door.admin_url, door.exited)
    if not any(isinstance(p, doors.EngineDown) for p in out.problems):
        if running and _cancelled(door) <= before:
            out.problems.append(doors.SlotBusy(f"the engine did not count the abandoned request as cancelled "
                                               f"(it ran to its limit; it was at {running[0].get('n_decoded')} "
                                               f"tokens when the client left)"))
        out.problems += doors.follow_up(door.client, door.url)
    out.seconds = time.monotonic() - left
    kept(door, case, out)


def test_session_id_header_and_field_disagree(front_door: Door) -> None:
    """Both forms at once: the body field wins, any value is a 200 or a 400, never worse."""
    for header, value in [("abc", "\ud800"), ("\xff\xfe", "x" * 300), ("ok", 12), ("ok", None), ("", "")]:
        case = doors.Case(doors.CHAT, doors.encode({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                                    "session_id": value}), {"X-Session-Id": header})
        kept(front_door, case, front_door.check(case))


def test_the_strategies_reach_the_engine(door: Door) -> None:
    """A guard on the strategies themselves: valid bodies with hostile content are served (200), so
    the property tests exercise generation and not only the parser."""
    body = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                         {"role": "user", "content": "Hi \x01 \u2028 \U0001f600"}],
            "max_tokens": 2, "stop": ["\n\n"], "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0, "user": "x", "n": 1, "logprobs": False, "tools": [], "unknown": {"a": [1]}}
    case = doors.Case(doors.CHAT, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == "sse"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}, "auto"])
def test_the_tool_strategies_reach_the_engine(door: Door, stream: bool, choice: object) -> None:
    """The same guard for tools: valid tools with a history of calls and results are served, whole
    and streamed, and a forced call comes back as one (the invariant checks its shape)."""
    tools = [{"type": "function", "function": {"name": name, "description": "d \u2028 <b>", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "enum": ["a", "b"]}}, "required": ["q"],
        "additionalProperties": False}}} for name in ("get_weather", "lookup")]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": {"q": "a"}}}
    body = {"messages": [{"role": "user", "content": "Look up a."}, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "found"}, {"role": "user", "content": "Again."}],
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": 40, "temperature": 0,
            "stream": stream}
    case = doors.Case(doors.CHAT, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == ("sse" if stream else "json"), out


@pytest.mark.parametrize("stream", [True, False])
def test_the_native_strategies_reach_the_engine(door: Door, stream: bool) -> None:
    """The same guard for /completion: a token-id prompt with the fields llama-server clients send is
    served, whole and streamed, in llama-server's shape (checked by the invariant)."""
    body = {"prompt": [1, 504, 3458, 314], "n_predict": 3, "stream": stream, "return_tokens": True,
            "cache_prompt": False, "n_probs": 0, "stop": ["\n\n"], "temperature": 0, "id_slot": -1}
    case = doors.Case(doors.NATIVE, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == ("sse" if stream else "json"), out


@pytest.mark.parametrize("stream", [True, False])
def test_the_progress_and_infill_strategies_reach_the_engine(door: Door, stream: bool) -> None:
    """``return_progress`` is served (a stream's progress events checked by the invariant), and a
    well-formed /infill reaches the engine, whose SmolLM2 has no FIM tokens: llama-server's 501."""
    body = {"prompt": "Once upon a time", "n_predict": 2, "stream": stream, "return_progress": True}
    case = doors.Case(doors.NATIVE, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == ("sse" if stream else "json"), out
    fim = {"input_prefix": ["def f(", 504], "input_suffix": "", "input_extra": [{"text": "x"}], "stream": stream}
    case = doors.Case(doors.INFILL, json.dumps(fim).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 501 and out.code == "not_supported", out


LOGPROBS_BODIES = [
    (doors.CHAT, {"messages": [{"role": "user", "content": "Hi \U0001f600"}], "logprobs": True, "top_logprobs": 20}),
    (doors.COMPLETIONS, {"prompt": "Once upon a time", "logprobs": 5}),
    (doors.NATIVE, {"prompt": [1, 504, 3458, 314], "n_probs": 100}),
]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path,fields", LOGPROBS_BODIES, ids=["chat", "completions", "native"])
def test_the_logprobs_strategies_reach_the_engine(door: Door, path: str, fields: dict[str, object],
                                                  stream: bool) -> None:
    """Log-probabilities at their largest per endpoint are served, whole and streamed, and their
    shapes hold (checked by the invariant, which checks every answer that carries them)."""
    body = {**fields, "max_tokens": 4, "stream": stream, "temperature": 0}
    case = doors.Case(path, json.dumps(body).encode(), {})
    out = door.check(case)
    kept(door, case, out)
    assert out.status == 200 and out.kind == ("sse" if stream else "json"), out
    if not stream:  # present when asked (the invariant checks the shape of whatever is there)
        got = door.client.post(door.url + path, json=body, timeout=60).json()
        probs = got["completion_probabilities"] if path == doors.NATIVE else got["choices"][0]["logprobs"]
        assert probs, got

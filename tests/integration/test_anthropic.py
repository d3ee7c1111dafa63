"""Anthropic's Messages API (POST /v1/messages) on a real engine and through the front door: the
same greedy text as the equivalent chat completion, Anthropic's answer and event shapes, each
stop_reason, refusals in Anthropic's error shape; and /v1/models' aliases at both doors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

SYSTEM = "You are a geography teacher. Answer in one short sentence."
QUESTION = "What is the capital of France?"
PROFILES = {"profiles": {"one": {"description": "one SmolLM2 engine",
                                 "engines": {"solo": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
            "default": "one"}
NAMES = ["SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"]


def anthropic_body(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "smollm2-135m", "max_tokens": 24, "system": SYSTEM,
                            "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}
    body.update(kw)
    return body


def chat_twin(http: httpx.Client, **kw: Any) -> dict[str, Any]:
    r = http.post("/v1/chat/completions", json={
        "model": "smollm2-135m", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], **kw})
    assert r.status_code == 200, r.text
    return r.json()


def check_message(m: dict[str, Any]) -> None:
    assert m["id"].startswith("msg_") and m["type"] == "message" and m["role"] == "assistant", m
    assert m["model"] == "smollm2-135m" and isinstance(m["content"], list) and len(m["content"]) == 1
    assert m["content"][0]["type"] == "text" and isinstance(m["content"][0]["text"], str)
    assert m["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    assert set(m["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens"}


def stream_events(http: httpx.Client, body: dict[str, Any], **kw: Any) -> list[tuple[str, dict[str, Any]]]:
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}, **kw) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        ev = json.loads(data[len("data: "):])
        assert ev["type"] == name[len("event: "):], block
        out.append((ev["type"], ev))
    return out


def check_stream(evs: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """The text of a well-formed event sequence, and its message_delta."""
    names = [n for n, _ in evs]
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) <= {"content_block_delta"}, names
    start = evs[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["model"] == "smollm2-135m"
    text = "".join(ev["delta"]["text"] for n, ev in evs if n == "content_block_delta")
    assert all(ev["delta"]["type"] == "text_delta" and ev["index"] == 0 for n, ev in evs if n == "content_block_delta")
    return text, evs[-2][1]


def check_refusal(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert "Traceback" not in r.text
    for word in words:
        assert word in body["error"]["message"], (word, body)


def same_answers(http: httpx.Client) -> None:
    """Whole and streamed answers equal the equivalent chat completion's, with its counts."""
    chat = chat_twin(http)
    r = http.post("/v1/messages", json=anthropic_body())
    assert r.status_code == 200, r.text
    m = r.json()
    check_message(m)
    assert m["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert m["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    u = m["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == chat["usage"]["prompt_tokens"]
    assert u["output_tokens"] == chat["usage"]["completion_tokens"]
    text, delta = check_stream(stream_events(http, anthropic_body()))
    assert text == m["content"][0]["text"] and delta["delta"]["stop_reason"] == m["stop_reason"]
    assert delta["usage"]["output_tokens"] == u["output_tokens"]
    # the system prompt is applied: without it the answer is the chat twin's without it
    bare = http.post("/v1/messages", json=anthropic_body(system=None, max_tokens=12)).json()
    bare_chat = http.post("/v1/chat/completions", json={"max_tokens": 12, "temperature": 0, "messages": [
        {"role": "user", "content": QUESTION}]}).json()
    assert bare["content"][0]["text"] == bare_chat["choices"][0]["message"]["content"]


def stop_reasons(http: httpx.Client) -> None:
    full = http.post("/v1/messages", json=anthropic_body(max_tokens=24)).json()["content"][0]["text"]
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = http.post("/v1/messages", json=anthropic_body(stop_sequences=[stop, "zzz-never"]))
    assert cut.status_code == 200, cut.text
    c = cut.json()
    assert c["stop_reason"] == "stop_sequence" and c["stop_sequence"] == stop, c
    assert c["content"][0]["text"] == full[: full.index(stop)]
    text, delta = check_stream(stream_events(http, anthropic_body(stop_sequences=[stop])))
    assert text == c["content"][0]["text"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    short = http.post("/v1/messages", json=anthropic_body(max_tokens=3)).json()
    assert short["stop_reason"] == "max_tokens" and short["stop_sequence"] is None
    assert short["usage"]["output_tokens"] == 3
    _, delta = check_stream(stream_events(http, anthropic_body(max_tokens=3)))
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


HOSTILE: list[tuple[Any, int, tuple[str, ...]]] = [
    (anthropic_body(tools=[{"name": "f", "input_schema": {"type": "string"}}]), 400, ("tools[0].input_schema",)),
    (anthropic_body(thinking={"type": "enabled", "budget_tokens": 2048}), 400, ("thinking",)),
    (anthropic_body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]), 400,
     ("image",)),
    (anthropic_body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]), 400,
     ("tool_use_id",)),
    (anthropic_body(top_logprobs=3), 400, ("top_logprobs",)),
    (anthropic_body(max_tokens=None), 400, ("max_tokens",)),
    (anthropic_body(max_tokens=0), 400, ("max_tokens",)),
    (anthropic_body(messages=[]), 400, ("messages",)),
    (anthropic_body(messages=[{"role": "system", "content": "x"}]), 400, ("role",)),
    (anthropic_body(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]), 400,
     ("prefill",)),
    (anthropic_body(temperature=3), 400, ("temperature",)),
    (anthropic_body(stop_sequences=["a", "b", "c", "d", "e"]), 400, ("stop_sequences",)),
    (anthropic_body(system=[{"type": "text"}]), 400, ("system[0].text",)),
    ([1, 2, 3], 400, ("object",)),
    ("just text", 400, ()),
    (None, 400, ()),
]


def hostile(http: httpx.Client) -> None:
    for body, status, words in HOSTILE:
        check_refusal(http.post("/v1/messages", json=body), status, *words)
    check_refusal(http.post("/v1/messages", content=b"{not json", headers={"Content-Type": "application/json"}),
                  400, "JSON")
    nested: Any = "x"
    for _ in range(40):
        nested = [nested]
    check_refusal(http.post("/v1/messages", json=anthropic_body(metadata={"a": nested})), 400, "nested")
    check_refusal(http.post("/v1/messages", content=b'{"max_tokens": 5, "messages": [{"role": "user", "content": '
                                                   b'"\\ud800"}]}'), 400)
    r = http.post("/v1/messages", json=anthropic_body(stream=True, tools=[{"name": "f"}]))
    check_refusal(r, 400, "tools")  # refused before the stream starts: a real status, not an event


def test_engine_messages(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    same_answers(http)
    stop_reasons(http)
    hostile(http)
    # another model's name is served by the engine's one model, as llama-server serves it
    other = http.post("/v1/messages", json=anthropic_body(model="claude-sonnet-4-5", max_tokens=2))
    assert other.status_code == 200 and other.json()["model"] == "smollm2-135m", other.text
    too_big = http.post("/v1/messages", content=b'{"x": "' + b"a" * (9 << 20) + b'"}')
    check_refusal(too_big, 413)
    assert too_big.json()["error"]["type"] == "request_too_large"
    assert smollm_engine.http.get("/livez").status_code == 200
    r = http.post("/v1/messages", json=anthropic_body(max_tokens=4))
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 4  # still serving
    models = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["smollm2-135m"] and models[0]["aliases"] == sorted(NAMES)
    assert models[0]["object"] == "model" and "meta" in models[0]
    for name in NAMES:  # every alias is a name a request may use
        assert http.post("/v1/messages", json=anthropic_body(model=name, max_tokens=2)).status_code == 200, name


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults={"n_ctx": 2048, "n_threads": 1},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_front_door_messages(pool: tuple[Coordinator, Engine]) -> None:
    c, e = pool
    same_answers(c.http)
    direct = e.http.post("/v1/messages", json=anthropic_body()).json()
    via = c.http.post("/v1/messages", json=anthropic_body(), headers={"X-Session-Id": "anthropic-1"})
    assert via.status_code == 200 and via.json()["content"] == direct["content"], via.text
    assert via.headers["x-hydra-engine"] == "solo" and via.headers["x-session-id"] == "anthropic-1"
    stop_reasons(c.http)
    hostile(c.http)
    # the pool knows no such model (and has no default_model): a 404 naming it
    check_refusal(c.http.post("/v1/messages", json=anthropic_body(model="claude-sonnet-4-5")), 404,
                  "claude-sonnet-4-5")
    check_refusal(c.http.post("/v1/messages", json=anthropic_body(session_id="bad\nid")), 400, "session_id")
    assert e.http.get("/livez").status_code == 200
    models = c.http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["smollm2-135m"] and models[0]["aliases"] == sorted(NAMES)
    assert models[0]["meta"]["engines"] == ["solo"]
    for name in NAMES:
        assert c.http.post("/v1/messages", json=anthropic_body(model=name, max_tokens=2)).status_code == 200, name

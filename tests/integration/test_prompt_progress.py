"""llama-server's ``return_progress`` on a streamed /completion, on a real engine (SmolLM2) whose
batch is small enough that a prompt takes several prefill steps: ``prompt_progress`` events come
first, ``processed`` rising from the cached count to ``total``; a request that does not ask (or
is not streamed) gets none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.support.engine import Engine

pytestmark = pytest.mark.model

N_BATCH = 64
PROMPT = "Once upon a time, in a land far away, there lived a curious fox. " * 12


@pytest.fixture
def engine(smollm_path: Path, start_engine: Callable[..., Engine]) -> Engine:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_batch": N_BATCH, "n_ctx": 2048,
                               "n_parallel": 1})
    e.wait_ready()
    return e


def stream(http: httpx.Client, body: dict[str, Any], path: str = "/completion") -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    return [json.loads(b[len("data: "):]) for b in raw.split("\n\n") if b.strip() and b.strip() != "data: [DONE]"]


def check_progress(evs: list[dict[str, Any]], total: int, cache: int) -> list[dict[str, Any]]:
    """The progress events, checked: all before the first content, ``processed`` rising from
    ``cache`` to ``total``; returns them."""
    n = next(i for i, e in enumerate(evs) if "prompt_progress" not in e)
    progress = [e["prompt_progress"] for e in evs[:n]]
    assert not any("prompt_progress" in e for e in evs[n:])
    assert all(set(p) == {"total", "cache", "processed", "time_ms"} for p in progress)
    assert all(p["total"] == total and p["cache"] == cache for p in progress)
    done = [p["processed"] for p in progress]
    assert done[0] == cache and done[-1] == total and done == sorted(set(done)), done
    assert all(b - a <= N_BATCH for a, b in zip(done, done[1:])), done
    times = [p["time_ms"] for p in progress]
    assert times == sorted(times)
    assert all(e["content"] == "" and e["tokens"] == [] and e["stop"] is False for e in evs[:n])
    return progress


def test_progress_rises_to_the_prompt_length(engine: Engine) -> None:
    http = engine.http
    body = {"prompt": PROMPT, "n_predict": 4, "return_progress": True, "cache_prompt": False}
    evs = stream(http, body)
    total = evs[-1]["tokens_evaluated"]
    assert total > 3 * N_BATCH
    progress = check_progress(evs, total, 0)
    assert len(progress) == 1 + -(-total // N_BATCH)  # one as the slot takes it, one per prefill step
    plain = stream(http, {**body, "return_progress": False})
    assert not any("prompt_progress" in e for e in plain)
    assert "".join(e["content"] for e in plain) == "".join(e["content"] for e in evs)
    # not streamed: the answer as without it (llama-server sends progress only on a stream)
    whole = http.post("/completion", json=body).json()
    assert "prompt_progress" not in whole and whole["content"] == "".join(e["content"] for e in evs)


def test_progress_counts_the_cached_prefix(engine: Engine) -> None:
    body = {"prompt": PROMPT, "n_predict": 2, "return_progress": True}
    stream(engine.http, body)
    evs = stream(engine.http, {**body, "prompt": PROMPT + "The end."})
    cached = evs[-1]["tokens_cached"]
    assert cached > 3 * N_BATCH
    check_progress(evs, evs[-1]["tokens_evaluated"], cached)


@pytest.mark.parametrize("value", ["yes", 1, None, [], {}])
def test_bad_values_are_refused_by_name(shared_smollm_engine: Engine, value: Any) -> None:
    r = shared_smollm_engine.http.post("/completion", json={"prompt": "x", "return_progress": value})
    assert r.status_code == 400 and "return_progress" in r.text, r.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_streams_carry_progress_chunks(engine: Engine, path: str) -> None:
    """llama-server's ``return_progress`` on the OpenAI doors: chunks with ``prompt_progress`` (and the
    opening delta, no text) before the first token, ``processed`` rising to the prompt's length."""
    ask = ({"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT})
    body = {**ask, "max_tokens": 2, "return_progress": True, "stream_options": {"include_usage": True}}
    evs = stream(engine.http, body, path)
    total = next(e for e in evs if e.get("usage"))["usage"]["prompt_tokens"]
    if "chat" in path:  # a chat stream opens with the role chunk, then the progress chunks carry it too
        assert "prompt_progress" not in evs[0] and evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        evs = evs[1:]
    n = next(i for i, e in enumerate(evs) if "prompt_progress" not in e)
    done = [e["prompt_progress"]["processed"] for e in evs[:n]]
    assert n >= 1 + total // N_BATCH and done[-1] == total and done == sorted(set(done)), done
    assert not any("prompt_progress" in e for e in evs[n:])
    first = evs[0]["choices"][0]
    assert (first["delta"] == {"role": "assistant", "content": None}) if "chat" in path else first["text"] == ""
    plain = stream(engine.http, {**body, "return_progress": False}, path)
    assert not any("prompt_progress" in e for e in plain)
    bad = engine.http.post(path, json={**body, "return_progress": "yes"})
    assert bad.status_code == 400 and "return_progress" in bad.text, bad.text

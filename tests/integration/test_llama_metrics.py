"""``/metrics`` and ``timings`` as llama-server serves them, on hydrad started with llama-server's
command line and the real model: ``/metrics`` only with ``--metrics`` (501 otherwise, as
llama-server), every ``llamacpp:*`` series llama-server writes with its ``# TYPE`` line, the prompt
tokens processed and reused counted as the answers' timings count them, embeddings' prompts counted,
the generation rate over the steps after the first token, and the timings of prompt progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.engine import Engine, free_port

pytestmark = pytest.mark.model

COUNTERS = ["prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
            "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max", "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total"]
GAUGES = ["prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
          "n_busy_slots_per_decode"]


def _engine(smollm_path: Path, start_engine: Callable[..., Engine], *more: str) -> Engine:
    port = free_port()
    e = start_engine(name="metrics", port=port, flags=[
        "-m", str(smollm_path), "--port", str(port), "-c", "1024", "-np", "1", "-t", "1", "-b", "32", *more])
    e.wait_ready(120)
    return e


def _series(e: Engine) -> dict[str, tuple[str, float]]:
    r = e.http.get("/metrics")
    assert r.status_code == 200, r.text
    assert int(r.headers["Process-Start-Time-Unix"]) > 1_600_000_000
    types: dict[str, str] = {}
    out: dict[str, tuple[str, float]] = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split(" ", 1)
            assert name in types, f"{name} has no # TYPE line"
            out[name] = (types[name], float(value))
    return out


def test_metrics_are_off_without_the_flag(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = _engine(smollm_path, start_engine)
    r = e.http.get("/metrics")
    assert r.status_code == 501 and r.json()["error"]["code"] == "not_supported", r.text


def test_llamacpp_series_count_what_the_answers_report(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = _engine(smollm_path, start_engine, "--metrics", "--embeddings", "--pooling", "mean")
    processed = cached = predicted = 0
    for n in (1, 4, 16):
        b = e.http.post("/completion", json={"prompt": "the quick brown fox jumps over the lazy dog",
                                             "n_predict": n, "temperature": 0, "ignore_eos": True}).json()
        t = b["timings"]
        processed, cached, predicted = processed + t["prompt_n"], cached + t["cache_n"], predicted + t["predicted_n"]
        assert t["predicted_n"] == n and t["prompt_ms"] > 0 and t["prompt_per_token_ms"] > 0
        assert all(v is not None and v >= 0 for v in t.values()), t
        if n == 1:  # the first token costs no decode step of its own
            assert t["predicted_per_second"] == 0.0 and t["predicted_per_token_ms"] == 0.0
        else:
            assert abs(t["predicted_per_second"] - 1e3 / t["predicted_ms"] * (n - 1)) < 1e-6
    assert cached > 0  # the same prompt again reuses the slot's cache
    m = _series(e)
    assert {f"llamacpp:{k}": "counter" for k in COUNTERS} | {f"llamacpp:{k}": "gauge" for k in GAUGES} == {
        k: m[k][0] for k in [f"llamacpp:{x}" for x in COUNTERS + GAUGES]}
    assert m["llamacpp:prompt_tokens_total"][1] == processed
    assert m["llamacpp:prompt_tokens_cached_total"][1] == cached
    assert m["llamacpp:tokens_predicted_total"][1] == predicted
    assert m["llamacpp:n_tokens_max"][1] >= 16 and m["llamacpp:n_busy_slots_per_decode"][1] == 1.0
    assert m["llamacpp:predicted_tokens_seconds"][1] > 0  # this window saw the generations...
    assert _series(e)["llamacpp:predicted_tokens_seconds"][1] == 0  # ...the next one nothing

    before = _series(e)
    r = e.http.post("/v1/embeddings", json={"input": ["hello world", "goodbye world"]})
    assert r.status_code == 200, r.text
    after = _series(e)
    assert after["llamacpp:prompt_tokens_total"][1] > before["llamacpp:prompt_tokens_total"][1]
    assert after["llamacpp:n_decode_total"][1] > before["llamacpp:n_decode_total"][1]
    assert after["llamacpp:tokens_predicted_total"][1] == before["llamacpp:tokens_predicted_total"][1]


def test_prompt_progress_carries_timings(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = _engine(smollm_path, start_engine)
    chunks: list[dict[str, Any]] = []
    with e.http.stream("POST", "/completion", json={
            "prompt": "the quick brown fox jumps over the lazy dog " * 8, "n_predict": 4, "stream": True,
            "timings_per_token": True, "return_progress": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    progress = [c["timings"] for c in chunks if "prompt_progress" in c]
    assert len(progress) > 1
    assert (progress[0]["prompt_n"], progress[0]["prompt_ms"], progress[0]["predicted_n"]) == (0, 0.0, 0)
    ms = [p["prompt_ms"] for p in progress]
    assert ms == sorted(ms) and ms[-1] > 0 and progress[-1]["prompt_n"] > 0

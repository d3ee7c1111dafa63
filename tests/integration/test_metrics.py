"""``/metrics`` of both daemons, read as Prometheus reads it (``prometheus_client.parser``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.coordinator import Coordinator
from tests.support.engine import REPO, Engine

pytestmark = pytest.mark.model

DEV_PROFILES = REPO / "etc" / "hydra" / "dev" / "profiles.yaml"
DEV = {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) → value, for every sample of an exposition."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_engine_metrics_parse_with_llama_server_names(smollm_engine: Engine) -> None:
    r = smollm_engine.http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200
    resp = smollm_engine.http.get("/metrics")
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = samples(resp.text)
    assert families(resp.text)["llamacpp:prompt_tokens"] == "counter"
    assert got[("llamacpp:tokens_predicted_total", ())] >= 3
    assert got[("llamacpp:n_decode_total", ())] >= 1
    assert got[("hydra_requests_total", ())] >= 1
    assert ("llamacpp:requests_processing", ()) in got and ("llamacpp:requests_deferred", ()) in got
    assert got[("hydra_stage", (("engine", "test"), ("stage", "ready")))] == 1
    assert got[("hydra_stage", (("engine", "test"), ("stage", "idle")))] == 0


def test_step_time_is_accounted_by_part(smollm_engine: Engine) -> None:
    """The engine thread's step time by part: every part present, none negative, and a step's parts
    no longer together than the request that ran them."""
    before = samples(smollm_engine.http.get("/metrics").text)
    r = smollm_engine.http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Hello there",
                                                          "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    wall_s = r.elapsed.total_seconds()
    timings = r.json()["timings"]
    assert 0 <= timings["to_engine_ms"] <= timings["admit_ms"] <= timings["server_ttft_ms"] <= timings["server_ms"]
    assert timings["predicted_ms"] <= timings["server_ms"] <= wall_s * 1000
    after = samples(smollm_engine.http.get("/metrics").text)
    steps = after[("hydra_steps_total", ())] - before[("hydra_steps_total", ())]
    assert steps >= 8  # the prefill and one step per further token
    parts = {}
    for part in ("submit", "overlap", "device_wait", "sample", "between"):
        key = ("hydra_step_seconds_total", (("part", part),))
        parts[part] = after[key] - before[key]
        assert parts[part] >= 0
    assert parts["submit"] > 0 and parts["sample"] > 0  # on a CPU the compute is inside llama_decode
    assert sum(parts.values()) <= wall_s


@pytest.mark.parametrize("path,stream", [("/v1/chat/completions", True), ("/completion", False), ("/completion", True)])
def test_every_answer_says_how_long_the_server_held_it(smollm_engine: Engine, path: str, stream: bool) -> None:
    """``server_ms`` (arrival at the handler to its last event) in the final timings of every kind of
    answer, streamed or not: at least the time to the first token, at most what the client waited."""
    body: dict = {"model": "smollm2-135m", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": stream}
    if path.startswith("/v1/chat"):
        body["messages"] = [{"role": "user", "content": "Hello there"}]
    else:
        body["prompt"] = "Hello there"
    t0 = time.monotonic()
    r = smollm_engine.http.post(path, json=body)
    wall_ms = (time.monotonic() - t0) * 1000
    assert r.status_code == 200
    if stream:
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        timings = next(e["timings"] for e in reversed(events) if e.get("timings"))
    else:
        timings = r.json()["timings"]
    assert 0 < timings["server_ttft_ms"] <= timings["server_ms"] <= wall_ms
    assert timings["predicted_ms"] <= timings["server_ms"]


def test_coordinator_metrics(tmp_path: Path, smollm_path: Path, gemma_path: Path,
                             start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=DEV_PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        for name in DEV:
            start_engine(name=name, defaults={"n_ctx": 2048, "n_parallel": 2, "n_threads": 1},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_serving(DEV)
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
        assert c.http.post("/v1/chat/completions", json={**body, "model": "smollm2-135m"}).status_code == 200
        assert c.http.post("/v1/chat/completions", json={**body, "model": "gemma3-270m", "stream": True}).status_code == 200
        assert c.http.post("/v1/chat/completions", json={**body, "model": "no-such-model"}).status_code == 404

        resp = c.http.get("/metrics")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = samples(resp.text)
        kinds = families(resp.text)
        assert kinds["hydra_coordinator_requests"] == "counter"
        assert kinds["hydra_coordinator_ttft_seconds"] == kinds["hydra_coordinator_queue_seconds"] == "histogram"
        req = "hydra_coordinator_requests_total"
        assert got[(req, (("engine", "dev-a"), ("model", "smollm2-135m"), ("status", "200")))] == 1
        assert got[(req, (("engine", "dev-b"), ("model", "gemma3-270m"), ("status", "200")))] == 1
        assert got[(req, (("engine", ""), ("model", ""), ("status", "404")))] == 1
        for hist in ("hydra_coordinator_ttft_seconds", "hydra_coordinator_queue_seconds"):
            for engine, model in (("dev-a", "smollm2-135m"), ("dev-b", "gemma3-270m")):
                labels = (("engine", engine), ("model", model))
                assert got[(hist + "_count", labels)] == 1
                assert got[(hist + "_sum", labels)] > 0
        ttft = got[("hydra_coordinator_ttft_seconds_sum", (("engine", "dev-a"), ("model", "smollm2-135m")))]
        queue = got[("hydra_coordinator_queue_seconds_sum", (("engine", "dev-a"), ("model", "smollm2-135m")))]
        assert queue <= ttft
        assert got[("hydra_coordinator_route_decisions_total", (("step", "cost"),))] >= 2
        assert got[("hydra_coordinator_engines_alive", ())] == 2
        assert got[("hydra_coordinator_engines_registered", ())] == 2
        assert not any(name.endswith("_created") for name, _ in got)
    finally:
        c.stop()

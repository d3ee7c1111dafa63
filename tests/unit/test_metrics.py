"""The metrics rendering of both daemons, without a daemon: a stand-in core and bus."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hydrad.coordinator.metrics import CoordinatorMetrics
from hydrad.engine.http import metrics as engine_metrics
from hydrad.engine.snapshot import EngineSnapshot
from hydrad.engine.stats import EngineStats
from hydrad.wire.stages import STAGES


def parsed(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_engine_exposition_keeps_the_llama_server_names() -> None:
    stats = EngineStats(prompt_tokens_total=12, tokens_predicted_total=5, prompt_seconds_total=0.1234567, n_decode_total=6)
    snap = EngineSnapshot(stage="ready", slots_busy=1, slots_total=4, queued=2, stats=stats)
    core = SimpleNamespace(snapshot=lambda: snap)
    text = engine_metrics.render(core, "gpu0")  # type: ignore[arg-type]
    lines = text.splitlines()
    assert "# TYPE llamacpp:prompt_tokens_total counter" in lines
    assert "llamacpp:prompt_tokens_total 12.0" in lines
    assert "llamacpp:prompt_seconds_total 0.123457" in lines
    assert "llamacpp:requests_processing 1.0" in lines and "llamacpp:requests_deferred 2.0" in lines
    assert 'hydra_stage{engine="gpu0",stage="ready"} 1.0' in lines
    assert not any("_created" in line for line in lines)
    fams = parsed(text)
    assert fams["llamacpp:tokens_predicted"].type == "counter"
    assert fams["llamacpp:tokens_predicted"].samples[0].value == 5
    assert fams["hydra_slots_total"].samples[0].value == 4
    assert [s.labels["stage"] for s in fams["hydra_stage"].samples] == list(STAGES)


def test_coordinator_metrics_render() -> None:
    engines = {"a": SimpleNamespace(alive=True), "b": SimpleNamespace(alive=False)}
    bus = SimpleNamespace(engines=engines, inflight_total=lambda: 3)
    m = CoordinatorMetrics(bus)
    m.request("smol", "a", 200)
    m.request(None, None, 404)
    m.ttft.labels("a", "smol").observe(0.2)
    m.queue.labels("a", "smol").observe(0.01)
    m.decisions.labels("session").inc()
    fams = parsed(m.render().decode())
    reqs = {(s.labels["model"], s.labels["engine"], s.labels["status"]): s.value
            for s in fams["hydra_coordinator_requests"].samples}
    assert reqs == {("smol", "a", "200"): 1, ("", "", "404"): 1}
    ttft = {s.name: s.value for s in fams["hydra_coordinator_ttft_seconds"].samples
            if s.labels.get("le") in (None, "0.25", "0.1")}
    assert ttft["hydra_coordinator_ttft_seconds_count"] == 1
    assert fams["hydra_coordinator_route_decisions"].samples[0].labels == {"step": "session"}
    assert fams["hydra_coordinator_engines_alive"].samples[0].value == 1
    assert fams["hydra_coordinator_engines_registered"].samples[0].value == 2
    assert fams["hydra_coordinator_inflight_requests"].samples[0].value == 3

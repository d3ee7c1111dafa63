"""Prometheus exposition for one engine, named like llama-server's ``llamacpp:*`` series where one
exists so existing dashboards keep working, plus Hydra's own ``hydra_*`` series.

A custom ``prometheus_client`` collector: every scrape reads the engine's counters as they are
(the engine thread owns them), so nothing is double-booked into client-library counters. The
high-level ``Counter``/``Gauge`` classes are not used because the ``llamacpp:`` names carry a
colon, which is for recording rules there; metric families accept it.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hydrad.engine.core import EngineCore
from hydrad.wire.stages import STAGES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    """The engine's counters and gauges, read from the core at scrape time."""

    def __init__(self, core: EngineCore, engine_name: str) -> None:
        self.core = core
        self.engine_name = engine_name

    def collect(self) -> Iterator[Metric]:
        snap = self.core.snapshot()
        s = snap.stats
        slots = snap.slots

        def counter(name: str, help_: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, help_, value=value)

        def gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_, value=value)

        yield counter("llamacpp:prompt_tokens_total", "Prompt tokens processed (not counting reused cache).",
                      s.prompt_tokens_total)
        yield counter("llamacpp:tokens_predicted_total", "Generated tokens.", s.tokens_predicted_total)
        yield counter("llamacpp:prompt_seconds_total", "Time spent on prompts.", round(s.prompt_seconds_total, 6))
        yield counter("llamacpp:tokens_predicted_seconds_total", "Time spent generating.",
                      round(s.predicted_seconds_total, 6))
        yield counter("llamacpp:n_decode_total", "llama_decode calls (one per batched step).", s.n_decode_total)
        yield counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative decoding: tokens drafted.",
                      s.spec_draft_tokens_total)
        yield counter("llamacpp:spec_decode_num_accepted_tokens_total",
                      "Speculative decoding: drafted tokens the model accepted.", s.spec_accepted_tokens_total)
        yield counter("llamacpp:spec_decode_num_drafts_total", "Speculative decoding: drafts verified.",
                      s.spec_drafts_total)
        yield gauge("llamacpp:requests_processing", "Requests holding a slot.", slots["busy"])
        yield gauge("llamacpp:requests_deferred", "Requests waiting for a slot.", slots["queued"])
        yield counter("hydra_cached_prompt_tokens_total", "Prompt tokens served from a slot's cache.",
                      s.cached_tokens_total)
        yield counter("hydra_cache_reuse_tokens_total", "Of those, tokens of chunks moved to new positions "
                      "(n_cache_reuse).", s.cache_reuse_tokens_total)
        yield counter("hydra_context_shifts_total", "Context shifts that let a generation go on past its "
                      "slot's context (ctx_shift).", s.context_shifts_total)
        yield counter("hydra_requests_total", "Requests admitted.", s.requests_total)
        yield counter("hydra_requests_cancelled_total", "Requests cancelled by their client.",
                      s.requests_cancelled_total)
        yield counter("hydra_requests_failed_total",
                      "Requests ended by an error of their own (the engine went on).", s.requests_failed_total)
        yield gauge("hydra_slots_busy", "Busy slots.", slots["busy"])
        yield gauge("hydra_slots_total", "Slots of the loaded generation.", slots["total"])
        yield counter("hydra_model_loads_total", "Completed model loads.", s.model_loads_total)
        yield gauge("hydra_model_load_seconds", "Duration of the last model load.", round(s.model_load_seconds, 4))
        yield counter("hydra_context_rebuilds_total", "T2 context rebuilds.", s.context_rebuilds_total)
        yield counter("hydra_sleeps_total", "Models freed after sleep_idle_seconds without a request.", s.sleeps_total)
        yield counter("hydra_peer_losses_total", "Generations set aside because a COMBINE peer died.", s.peer_losses_total)
        yield counter("hydra_lora_switches_total", "Steps that computed under other LoRA scales than the step "
                      "before (requests of different lora sets take turns; each switch re-plans llama.cpp's graph).",
                      s.lora_switches_total)
        yield counter("hydra_steps_total", "Batched steps (a batch decoded and its rows sampled).", s.steps_total)
        yield counter("hydra_steps_unwaited_total", "Steps of prompt rows only (nothing to sample) that the engine "
                      "thread did not wait for: it built the next step while the device computed (text_overlap).",
                      s.steps_unwaited_total)
        parts = CounterMetricFamily("hydra_step_seconds_total",
                                    "Engine-thread time of the steps, by part: submit (building the batch and the "
                                    "llama_decode call), overlap (text work while the device computes), device_wait "
                                    "(waiting for the device), sample (sampling and handing tokens on), between "
                                    "(the gap to the next step while steps follow each other).", labels=["part"])
        for part in ("submit", "overlap", "device_wait", "sample", "between"):
            parts.add_metric([part], round(getattr(s, f"step_{part}_seconds_total"), 6))
        yield parts
        stage = GaugeMetricFamily("hydra_stage", "Current lifecycle stage (1 for the current one).",
                                  labels=["engine", "stage"])
        current = snap.stage
        for st in STAGES:
            stage.add_metric([self.engine_name, st], 1 if current == st else 0)
        yield stage


def registry(core: EngineCore, engine_name: str) -> CollectorRegistry:
    """A registry of its own per engine app (never the process-global one: tests run several)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EngineCollector(core, engine_name))
    return reg


def render(core: EngineCore, engine_name: str) -> str:
    return generate_latest(registry(core, engine_name)).decode()

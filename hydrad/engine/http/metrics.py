"""Prometheus exposition for one engine, named like llama-server's ``llamacpp:*`` series where one
exists so existing dashboards keep working, plus Hydra's own ``hydra_*`` series.

A custom ``prometheus_client`` collector: every scrape reads the engine's counters as they are
(the engine thread owns them), so nothing is double-booked into client-library counters. The
high-level ``Counter``/``Gauge`` classes are not used because the ``llamacpp:`` names carry a
colon, which is for recording rules there; metric families accept it.

As llama-server: ``llamacpp:prompt_tokens_seconds`` and ``llamacpp:predicted_tokens_seconds`` are the
throughput over the window since the last scrape (each scrape starts a new window: the collector
keeps the totals it last read), ``llamacpp:n_busy_slots_per_decode`` the generating slots per decode,
and ``llamacpp:n_tokens_max`` (a counter that llama-server names without ``_total``, which the client
library cannot write) is appended to the text by :func:`exposition`. Each answer carries llama-server's
``Process-Start-Time-Unix`` header (:data:`PROCESS_START`).
"""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hydrad.engine.core import EngineCore
from hydrad.wire.stages import STAGES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

PROCESS_START = int(time.time())
"""When the engine process started (this module is imported at its boot), in Unix seconds."""


class EngineCollector(Collector):
    """The engine's counters and gauges, read from the core at scrape time."""

    def __init__(self, core: EngineCore, engine_name: str) -> None:
        self.core = core
        self.engine_name = engine_name
        # the totals the last scrape read: (prompt tokens, prompt seconds, predicted tokens, predicted seconds)
        self.window = (0.0, 0.0, 0.0, 0.0)

    def _rates(self, s: object) -> tuple[float, float]:
        """Prompt and generation tokens per second since the last scrape (0 when nothing ran)."""
        now = tuple(float(getattr(s, k)) for k in ("prompt_tokens_total", "prompt_seconds_total",
                                                   "tokens_predicted_total", "predicted_seconds_total"))
        d = [a - b for a, b in zip(now, self.window)]
        self.window = now  # type: ignore[assignment]
        return (d[0] / d[1] if d[1] > 0 else 0.0), (d[2] / d[3] if d[3] > 0 else 0.0)

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
        yield counter("llamacpp:prompt_tokens_cached_total", "Prompt tokens reused from a slot's cache.",
                      s.cached_tokens_total)
        yield counter("llamacpp:n_decode_total", "llama_decode calls (one per batched step, one per embedding "
                      "batch).", s.n_decode_total)
        yield counter("llamacpp:spec_decode_num_draft_tokens_total", "Speculative decoding: tokens drafted.",
                      s.spec_draft_tokens_total)
        yield counter("llamacpp:spec_decode_num_accepted_tokens_total",
                      "Speculative decoding: drafted tokens the model accepted.", s.spec_accepted_tokens_total)
        yield counter("llamacpp:spec_decode_num_drafts_total", "Speculative decoding: drafts verified.",
                      s.spec_drafts_total)
        yield gauge("llamacpp:requests_processing", "Requests holding a slot.", slots["busy"])
        yield gauge("llamacpp:requests_deferred", "Requests waiting for a slot.", slots["queued"])
        prompt_rate, predicted_rate = self._rates(s)
        yield gauge("llamacpp:prompt_tokens_seconds", "Prompt throughput since the last scrape, in tokens/s.",
                    round(prompt_rate, 3))
        yield gauge("llamacpp:predicted_tokens_seconds", "Generation throughput since the last scrape, in tokens/s.",
                    round(predicted_rate, 3))
        yield gauge("llamacpp:n_busy_slots_per_decode", "Generating slots per llama_decode call, on average.",
                    round(s.n_busy_slots_total / max(s.n_decode_total, 1), 4))
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


def exposition(reg: CollectorRegistry, core: EngineCore) -> bytes:
    """The text of one scrape: the registry's series, then ``llamacpp:n_tokens_max`` as llama-server
    writes it."""
    n = core.snapshot().stats.n_tokens_max
    return generate_latest(reg) + (
        "# HELP llamacpp:n_tokens_max The longest sequence a slot held (prompt + generation).\n"
        f"# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max {float(n)}\n").encode()


def render(core: EngineCore, engine_name: str) -> str:
    return exposition(registry(core, engine_name), core).decode()

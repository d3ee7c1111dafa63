"""Prometheus text exposition for one engine, named like llama-server's ``llamacpp:*`` series
where one exists so existing dashboards keep working, plus Hydra's own ``hydra_*`` series."""

from __future__ import annotations

from hydrad.engine.core import EngineCore
from hydrad.wire.stages import STAGES


def _line(out: list[str], name: str, kind: str, help_: str, value: float, labels: str = "") -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    out.append(f"{name}{labels} {value}")


def render(core: EngineCore, engine_name: str) -> str:
    snap = core.snapshot()
    s = snap.stats
    slots = snap.slots
    out: list[str] = []
    _line(out, "llamacpp:prompt_tokens_total", "counter", "Prompt tokens processed (not counting reused cache).", s.prompt_tokens_total)
    _line(out, "llamacpp:tokens_predicted_total", "counter", "Generated tokens.", s.tokens_predicted_total)
    _line(out, "llamacpp:prompt_seconds_total", "counter", "Time spent on prompts.", round(s.prompt_seconds_total, 6))
    _line(out, "llamacpp:tokens_predicted_seconds_total", "counter", "Time spent generating.", round(s.predicted_seconds_total, 6))
    _line(out, "llamacpp:n_decode_total", "counter", "llama_decode calls (one per batched step).", s.n_decode_total)
    _line(out, "llamacpp:requests_processing", "gauge", "Requests holding a slot.", slots["busy"])
    _line(out, "llamacpp:requests_deferred", "gauge", "Requests waiting for a slot.", slots["queued"])
    _line(out, "hydra_cached_prompt_tokens_total", "counter", "Prompt tokens served from a slot's cache.", s.cached_tokens_total)
    _line(out, "hydra_requests_total", "counter", "Requests admitted.", s.requests_total)
    _line(out, "hydra_requests_cancelled_total", "counter", "Requests cancelled by their client.", s.requests_cancelled_total)
    _line(out, "hydra_requests_failed_total", "counter", "Requests ended by an error of their own (the engine went on).",
          s.requests_failed_total)
    _line(out, "hydra_slots_busy", "gauge", "Busy slots.", slots["busy"])
    _line(out, "hydra_slots_total", "gauge", "Slots of the loaded generation.", slots["total"])
    _line(out, "hydra_model_loads_total", "counter", "Completed model loads.", s.model_loads_total)
    _line(out, "hydra_model_load_seconds", "gauge", "Duration of the last model load.", round(s.model_load_seconds, 4))
    _line(out, "hydra_context_rebuilds_total", "counter", "T2 context rebuilds.", s.context_rebuilds_total)
    out.append("# HELP hydra_stage Current lifecycle stage (1 for the current one).")
    out.append("# TYPE hydra_stage gauge")
    for st in STAGES:
        out.append(f'hydra_stage{{engine="{engine_name}",stage="{st}"}} {1 if snap.stage == st else 0}')
    return "\n".join(out) + "\n"

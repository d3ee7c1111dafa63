"""What the engine tells the coordinator about itself: its status in each heartbeat, the models it
could load and the host memory a load of each would take, and a step's TOKENS.

Read on the pulse loop (see :mod:`hydrad.engine.pulse`) from the engine's frozen snapshot, which any
thread may read; nothing here waits on the main loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydrad.common.registry import Registry
from hydrad.engine import weights
from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.engine.gpu import GPU_KINDS
from hydrad.engine.pulse import LoopTicker
from hydrad.engine.requests import Token
from hydrad.wire import messages as M
from hydrad.wire.stages import fetch_text


def step_tokens(req: str, batch: list[Any], logprobs: bool, ids: bool) -> M.Tokens | None:
    """TOKENS for a step's events, with the log-probabilities of their tokens when the request asked
    for them, their token ids when it asked for those, the tool calls they completed, the thinking
    they made and the timings so far (each absent otherwise: a request that asked for none sends what it always sent); None
    when the step made nothing to send."""
    tokens = [ev for ev in batch if isinstance(ev, Token)]
    texts = [ev.text for ev in tokens if ev.text]
    calls = [M.ToolCall.of(c) for ev in tokens for c in ev.calls] or None
    made = [i for ev in tokens for i in ev.ids] if ids else []
    reasoning = [ev.reasoning for ev in tokens if ev.reasoning] or None
    if not texts and not calls and not made and not reasoning:
        return None
    probs = [M.TokenLogprob.of(p) for ev in tokens for p in ev.probs] if logprobs else None
    usage = next((ev.usage for ev in reversed(tokens) if ev.usage is not None), None)  # the latest (timings_per_token)
    return M.Tokens(req=req, texts=texts or [""], logprobs=probs, tool_calls=calls, ids=made or None,
                    reasoning=reasoning, usage=None if usage is None else M.UsageInfo.of(usage))


class Speed:
    """Prefill and decode tokens/s of the serving model, measured from the core's counters.

    Counters are cumulative; the baseline resets when the serving generation changes, so a
    figure always describes the model being served, not an average across models.
    """

    def __init__(self) -> None:
        self.key: Any = None
        self.base = (0, 0.0, 0, 0.0)
        self.prefill = 0.0
        self.decode = 0.0

    def update(self, stats: Any, key: Any) -> tuple[float, float]:
        now = (stats.prompt_tokens_total, stats.prompt_seconds_total,
               stats.tokens_predicted_total, stats.predicted_seconds_total)
        if key != self.key:
            self.key, self.base, self.prefill, self.decode = key, now, 0.0, 0.0
            return 0.0, 0.0
        dp, dps, dd, dds = (a - b for a, b in zip(now, self.base))
        if dps > 0.01 and dp > 0:
            self.prefill = dp / dps
        if dds > 0.01 and dd > 0:
            self.decode = dd / dds
        return round(self.prefill, 2), round(self.decode, 2)


def models_on_disk(registry: Registry) -> list[str]:
    """The registry's models whose file is here (REGISTER and routing's on-demand loads use it)."""
    out = []
    for alias in sorted(registry.entries):
        try:
            registry.resolve(alias)
            out.append(alias)
        except Exception:
            continue
    return out


def models_fetchable(control: EngineControl, on_disk: list[str]) -> list[str]:
    """The registry's models whose file is not here but that this engine would fetch from its pool
    before loading (fetching on, the entry gives size_bytes and sha256, its path lies under
    models_dir): routing may load them on demand here, charging the transfer (REGISTER carries them)."""
    fetcher = getattr(control, "fetcher", None)
    if fetcher is None or not fetcher.settings.enabled:
        return []
    here = set(on_disk)
    return sorted(alias for alias, e in control.registry.entries.items()
                  if alias not in here and e.size_bytes and e.sha256 and not Path(e.path).is_absolute())


def host_weights(control: EngineControl, gpu: M.GpuInfo, models: list[str]) -> dict[str, int]:
    """For routing: per model on disk, the bytes of its weights a load here keeps in host memory, by the
    parameters this engine would load it with (an on-demand load's configure names only the model)."""
    if gpu.kind not in GPU_KINDS:
        return {}  # an engine without a GPU reports its host memory as its device's: nothing is kept off it
    layers = control.layers
    out: dict[str, int] = {}
    for alias in models:
        try:
            params = layers.effective_for({**layers.runtime, "model": alias})
            out[alias] = weights.host_bytes(control.registry.resolve(alias).path, params, 1)
        except Exception:  # an unreadable GGUF or parameters that do not validate: nothing known
            continue
    return out


def engine_status(core: EngineCore, speed: Speed, gpu: M.GpuInfo, ticker: LoopTicker | None) -> M.EngineStatus:
    """The heartbeat's status. An engine whose engine thread died, or whose main loop is hung for good
    (``ticker``), reports the stage ``failed``, whatever its snapshot says: nothing there would answer."""
    snap = core.snapshot()
    stage = snap.stage
    progress = snap.loading_progress
    prefill, decode = speed.update(snap.stats, snap.generation)
    load_s = snap.stats.model_load_seconds
    last_error = (snap.last_error or None) and str(snap.last_error)[:4096]
    if not snap.alive and stage not in ("starting", "stopping"):
        stage = "failed"
        last_error = last_error or "the engine thread died"
    elif ticker is not None and ticker.hung() and stage != "stopping":
        stage = "failed"
        last_error = f"the engine's event loop has not run for {ticker.stalled_for():.0f} s"
    pair = core.pairing.view(snap)
    return M.EngineStatus(
        stage=stage, model=snap.model_id or snap.asleep, generation=snap.generation,
        kv_family=snap.model.family if snap.model is not None else None, mode=pair["mode"], role=pair["role"],
        peers=pair["peers"][:8], serving=[b["peer"] for b in pair["serving"]][:8],
        progress=min(1.0, max(0.0, progress)) if progress is not None else None,
        load_id=snap.load_id, loading_model=snap.loading_model,
        slots_busy=snap.slots_busy, slots_total=snap.slots_total, queued=snap.queued, max_queue=snap.max_queue,
        n_ctx=snap.model.n_ctx if snap.model is not None else 0, prefill_tps=prefill, decode_tps=decode,
        load_seconds=load_s if load_s else None, vram_free=gpu.vram_free, last_error=last_error,
        fetch=_fetch_status(snap.fetch) if progress is not None else None)


def _fetch_status(fetch: dict[str, Any] | None) -> M.FetchStatus | None:
    if not fetch:
        return None
    return M.FetchStatus(bytes=fetch.get("bytes") or 0, total=fetch.get("total") or 0, bps=fetch.get("bps"),
                         eta_s=fetch.get("eta_s"), text=fetch_text(fetch) or "")

"""The engine's state as every view reads it: one frozen :class:`EngineSnapshot`.

``EngineCore`` rebuilds the snapshot (on the engine thread, the loader thread, or in one of its
own methods) whenever something it holds changes: the stage or load progress, the installed
generation, the running load, the last error, admission, the defaults in force. Readers take
``core.snapshot()`` without a lock. Nothing is rebuilt per token: the busy/queued counts are
filled in from live counters when a view asks, and ``stats`` is the live counter object.

``/health``, ``/metrics``, ``/v1/models``, the bus heartbeat, the merged port's INFO and
systemd's ``STATUS=`` all render from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hydrad.common.params import RuntimeParams
from hydrad.engine.stats import EngineStats
from hydrad.wire.stages import LOADING_STAGES, fetch_text

if TYPE_CHECKING:
    from hydrad.engine.generation import Generation


@dataclass(frozen=True)
class ModelSummary:
    """The installed generation, as the views describe it."""

    id: str
    path: str
    arch: str
    desc: str
    n_params: int
    size_bytes: int
    n_layer: int
    n_embd: int
    n_head_kv: int
    n_ctx_train: int
    n_vocab: int
    fingerprint: str  # the model file's
    family: str  # the KV family: the same for sibling quants (generation.kv_family)
    generation: str  # the generation's (model + context parameters)
    loaded_at: float
    n_ctx: int
    n_parallel: int
    n_ctx_slot: int  # the context one slot may fill: n_ctx with one KV pool, n_ctx / n_parallel without
    placement: dict[str, Any] | None = None  # devices, peers and overrides, when not llama.cpp's defaults
    aliases: tuple[str, ...] = ()  # the registry entry's further names (llama-server's --alias)
    weights: dict[str, Any] | None = None  # what the load did with the model parameters (Generation.load_view)

    @classmethod
    def of(cls, gen: Generation) -> ModelSummary:
        info = gen.model.info
        return cls(id=gen.resolved.id, path=info.path, arch=info.arch, desc=info.desc, n_params=info.n_params,
                   size_bytes=info.size_bytes, n_layer=info.n_layer, n_embd=info.n_embd, n_head_kv=info.n_head_kv,
                   n_ctx_train=info.n_ctx_train, n_vocab=info.n_vocab, fingerprint=gen.fingerprint, family=gen.family,
                   generation=gen.tag.fingerprint, loaded_at=gen.loaded_at, n_ctx=gen.ctx.n_ctx,
                   n_parallel=len(gen.slots), n_ctx_slot=gen.ctx.n_ctx_seq,
                   placement=gen.placement.public() if gen.placement is not None else None,
                   aliases=gen.resolved.aliases, weights=gen.load_view())


@dataclass(frozen=True)
class EngineSnapshot:
    stage: str = "starting"
    progress: float | None = None  # of the running load, 0..1, as last reported
    alive: bool = False  # the engine thread runs
    admitting: bool = True  # False once shutdown began
    model: ModelSummary | None = None  # the generation serving new requests
    load_id: int | None = None  # the running load
    loading_model: str | None = None
    last_error: str | None = None
    slots_busy: int = 0  # live when read through core.snapshot()
    slots_total: int = 0
    queued: int = 0  # live when read through core.snapshot()
    max_queue: int = 64
    params: RuntimeParams | None = None  # the defaults in force (T1 layer included)
    device: str | None = None  # the GPU binding from the settings
    standby: dict[str, Any] | None = None  # the other expert placement, resident for a fast mode switch
    asleep: str | None = None  # the model the idle sleep freed (stage "sleeping"); the next request loads it
    fetch: dict[str, Any] | None = None  # the running load's model file transfer (hydrad.engine.fetch), while it runs
    stats: EngineStats = field(default_factory=EngineStats, compare=False)  # live counters

    @property
    def model_id(self) -> str | None:
        return self.model.id if self.model is not None else None

    @property
    def generation(self) -> str | None:
        return self.model.generation if self.model is not None else None

    @property
    def slots(self) -> dict[str, int]:
        return {"busy": self.slots_busy, "total": self.slots_total, "queued": self.queued}

    @property
    def loading_progress(self) -> float | None:
        """The progress worth showing: only while a load runs."""
        return self.progress if self.progress is not None and self.stage in LOADING_STAGES else None


def status_text(snap: EngineSnapshot, with_progress: bool = True) -> str:
    """systemd's ``STATUS=`` line."""
    text = snap.stage
    progress = snap.loading_progress if with_progress else None
    if progress is not None:
        text += f" {fetch_text(snap.fetch) or f'{progress * 100:.0f}%'}"
    if snap.model is not None:
        text += f" model={snap.model.id} slots={snap.slots_busy}/{snap.slots_total}"
    elif snap.asleep is not None:
        text += f" model={snap.asleep} (freed until the next request)"
    return text


def slot_rows(gen: Generation | None, now: float) -> list[dict[str, Any]]:
    """Every slot of ``gen`` as it is now (read-only, any thread): the per-slot views (``/slots``,
    INFO's slot list) select from these rows."""
    if gen is None:
        return []
    out: list[dict[str, Any]] = []
    for sl in gen.slots:
        a = sl.active  # read once: the engine thread may end the request meanwhile
        row: dict[str, Any] = {"id": sl.id, "busy": a is not None, "n_tokens": len(sl.cache), "foreign": sl.foreign,
                               "n_ctx": gen.ctx.n_ctx_seq,
                               "speculative": gen.params.spec_type != "none"}
        if a is not None:  # the running request: prompt size, tokens decoded so far, its decode speed
            row.update(n_prompt=a.prompt_len, n_decoded=a.n_gen)
            spec = getattr(a, "spec", None)
            if spec is not None:  # its speculative decoding so far, named as llama-server's timings name it
                row.update(draft_n=spec.n_drafted, draft_n_accepted=spec.n_accepted)
            if a.n_gen > 1 and a.t_first:
                row["decode_tps"] = round((a.n_gen - 1) / max(1e-6, now - a.t_first), 2)
        out.append(row)
    return out

"""Model loads: the load record, the reload policy, and the memory estimate that picks it.

``overlap`` builds the next generation while the current one serves (both must fit);
``drain`` frees the current one first (stop admitting, let in-flight finish, free, load);
``auto`` picks by estimating the new generation's memory against what is free where it goes.
The estimate (:func:`estimate`) places the GGUF's tensors as llama.cpp will
(:mod:`hydrad.engine.weights`): the weights on the GPUs plus the KV for the context are compared
with the GPU's free memory, and the weights kept in host memory (the token embeddings, layers
not offloaded, experts that ``n_cpu_moe`` or ``override_tensors`` keep on the CPU) with the host's.
It is reported with the decision so an operator can see why a policy was chosen.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.engine import gguf_meta, weights
from hydrad.engine.weights import WeightSplit

HEADROOM = 1.10  # compute buffers and fragmentation on top of weights + KV


@dataclass
class LoadRecord:
    """One model load as reported by /control/loads/{id}, INFO and /health."""

    id: int
    model: str
    policy: str = "overlap"
    carry_kv: bool = False
    keep_standby: bool = False  # an expert-mode switch: the replaced generation stays resident as the standby
    phase: str = "queued"  # queued → draining → fetching → loading → warming → installing → done | failed | aborted
    progress: float = 0.0
    error: str | None = None
    estimate: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)  # what the load did with the weights (Generation.load_view)
    started: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float | None = None
    run_t0: float | None = field(default=None, repr=False, compare=False)  # time.monotonic() when the loader began
    carried: dict[str, int] = field(default_factory=dict)
    fetch: dict[str, Any] | None = None  # the model file's transfer, when the disk lacked it (hydrad.engine.fetch)
    threads_lent: int = 0  # CPU threads the serving generation lends this load (load_threads; it keeps at least one)
    abort: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    ended: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(
        default_factory=list, repr=False, compare=False)
    _wlock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def end(self) -> None:
        """The load has ended (its phase is terminal and the engine's stage says so): wake every waiter."""
        with self._wlock:
            self.ended.set()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:  # that loop has closed
                pass

    async def wait(self) -> LoadRecord:
        """Until the load has ended: done, failed, or aborted (superseded by a newer configure)."""
        if self.ended.is_set():
            return self
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._wlock:
            if self.ended.is_set():
                return self
            self._waiters.append((loop, fut))
        await fut
        return self

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "policy": self.policy, "carry_kv": self.carry_kv,
                "phase": self.phase, "progress": round(self.progress, 4), "error": self.error,
                "estimate": self.estimate, "weights": self.weights, "started": self.started, "timings": self.timings,
                "seconds": self.seconds, "carried": self.carried, "threads_lent": self.threads_lent,
                **({"fetch": dict(self.fetch)} if self.fetch is not None else {})}


TERMINAL_PHASES = ("done", "failed", "aborted")


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def mem_available() -> int:
    """Host memory available to a new allocation (MemAvailable), in bytes; 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class Estimate:
    """What a load will take, with :data:`HEADROOM`: ``device`` on the GPUs (the weights offloaded and the
    KV), ``host`` in host memory (the weights kept there; the KV too on an engine that offloads nothing).
    ``split`` is the weights alone, by where they go."""

    device: int
    host: int
    split: WeightSplit

    def public(self) -> dict[str, Any]:
        return {"device_need_bytes": self.device, "host_need_bytes": self.host, "weights": self.split.public()}


def estimate(resolved: ResolvedModel, params: RuntimeParams, kv_bytes_per_token: int | None,
             local_gpus: int) -> Estimate:
    """The memory a load of ``resolved`` with ``params`` takes on an engine with ``local_gpus`` GPUs. A
    GGUF whose tensor table cannot be read counts as its file size, all where the layers go."""
    try:
        split = weights.placement_split(resolved.path, params, local_gpus)
    except gguf_meta.GgufError:
        split = WeightSplit()
        split.add("device" if weights.gpu_count(params, local_gpus) and params.n_gpu_layers != 0 else "host",
                  resolved.path.stat().st_size)
    kv = (kv_bytes_per_token or 0) * (params.n_ctx or 0)
    offloads = weights.gpu_count(params, local_gpus) > 0 and params.n_gpu_layers != 0
    device = split.device + (kv if offloads else 0)
    host = split.host + (0 if offloads else kv)
    return Estimate(int(device * HEADROOM), int(host * HEADROOM), split)


def choose_policy(requested: str, need: int, free: int, has_current: bool, host_need: int = 0,
                  host_free: int = 0) -> tuple[str, dict[str, Any]]:
    """Resolve ``auto``: overlap when the new generation fits next to the current one. ``need``/``free``
    are the memory the weights and KV go to (the GPU's, or the host's on an engine without one);
    ``host_need``/``host_free``, when the weights are split, the part kept in host memory (experts on the
    CPU): both must fit. An unknown ``host_free`` (0) is not held against the load."""
    est: dict[str, Any] = {"need_bytes": need, "free_bytes": free}
    if host_need > 0:
        est.update(host_need_bytes=host_need, host_free_bytes=host_free)
    if not has_current:
        return "overlap", {**est, "why": "no model loaded: nothing to overlap with"}
    if requested in ("overlap", "drain"):
        return requested, {**est, "why": f"reload_policy={requested}"}
    if free <= 0:
        return "drain", {**est, "why": "free memory unknown: drain is the safe choice"}
    if need > free:
        return "drain", {**est, "why": "the new generation does not fit beside the current one"}
    if host_need > 0 and 0 < host_free < host_need:
        return "drain", {**est, "why": "the new generation's host-memory weights do not fit beside the current one"}
    return "overlap", {**est, "why": "the new generation fits beside the current one"}

"""Model loads: the load record, the reload policy, and the memory estimate that picks it.

``overlap`` builds the next generation while the current one serves (both must fit);
``drain`` frees the current one first (stop admitting, let in-flight finish, free, load);
``auto`` picks by estimating the new generation's memory against what is free on the device
that will hold the weights. The estimate is deliberately simple — file size plus KV for the
context — and reported with the decision so an operator can see why a policy was chosen.
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

HEADROOM = 1.10  # compute buffers and fragmentation on top of weights + KV


@dataclass
class LoadRecord:
    """One model load as reported by /control/loads/{id}, INFO and /health."""

    id: int
    model: str
    policy: str = "overlap"
    carry_kv: bool = False
    keep_standby: bool = False  # an expert-mode switch: the replaced generation stays resident as the standby
    phase: str = "queued"  # queued → draining → loading → warming → installing → done | failed | aborted
    progress: float = 0.0
    error: str | None = None
    estimate: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float | None = None
    run_t0: float | None = field(default=None, repr=False, compare=False)  # time.monotonic() when the loader began
    carried: dict[str, int] = field(default_factory=dict)
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
                "estimate": self.estimate, "started": self.started, "timings": self.timings,
                "seconds": self.seconds, "carried": self.carried, "threads_lent": self.threads_lent}


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


def estimate_bytes(resolved: ResolvedModel, params: RuntimeParams, kv_bytes_per_token: int | None) -> int:
    weights = resolved.path.stat().st_size
    kv = (kv_bytes_per_token or 0) * (params.n_ctx or 0)
    return int((weights + kv) * HEADROOM)


def choose_policy(requested: str, need: int, free: int, has_current: bool) -> tuple[str, dict[str, Any]]:
    """Resolve ``auto``: overlap when the new generation fits next to the current one."""
    est = {"need_bytes": need, "free_bytes": free}
    if not has_current:
        return "overlap", {**est, "why": "no model loaded: nothing to overlap with"}
    if requested in ("overlap", "drain"):
        return requested, {**est, "why": f"reload_policy={requested}"}
    if free <= 0:
        return "drain", {**est, "why": "free memory unknown: drain is the safe choice"}
    if need <= free:
        return "overlap", {**est, "why": "the new generation fits beside the current one"}
    return "drain", {**est, "why": "the new generation does not fit beside the current one"}

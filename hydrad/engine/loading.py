"""Model loads on a loader thread: the policy decision, the build of the next generation while
the current one serves, the hand-over to the engine thread, and the roll-back when it fails.

``Loading`` is part of :class:`hydrad.engine.core.EngineCore`; ``load`` and ``abort_load`` are
called on the event loop, the rest runs on the load's own thread (``hydrad-loader-N``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any, Callable

from hydrad.common import heap
from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread
from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.engine import llama
from hydrad.engine.commands import Drain, Install, Resume
from hydrad.engine.generation import Generation, build_generation
from hydrad.engine.gpu import GPU_KINDS, local_devices
from hydrad.engine.loader import LoadRecord, choose_policy, estimate_bytes, mem_available
from hydrad.engine.reaper import Reaper
from hydrad.engine.stats import EngineStats

log = logging.getLogger("hydrad.engine")


class EngineBusy(RuntimeError):
    """Another load or rebuild is under way."""



class Loading:
    gen: Generation | None
    stats: EngineStats
    loads: dict[int, LoadRecord]
    current_load: LoadRecord | None
    _cmds: Any
    reaper: Reaper
    load_threads: int
    _lock: threading.Lock
    _load_ids: int
    _pending_swap: Any
    # provided by EngineCore
    _set_stage: Callable[..., None]
    record_error: Callable[[str | None], None]

    def load(self, resolved: ResolvedModel, params: RuntimeParams, on_success: Callable[[], None] | None = None,
             policy: str = "auto", carry_kv: bool = False, kv_bytes_per_token: int | None = None,
             keep_standby: bool = False) -> LoadRecord:
        """T3: load a model on a loader thread. ``overlap`` keeps the current generation serving until
        the new one takes over; ``drain`` frees it first; ``carry_kv`` moves every slot's KV across."""
        with self._lock:
            if self.current_load is not None or self._pending_swap is not None:
                raise EngineBusy(f"load {self.current_load.id if self.current_load else '?'} is under way; "
                                 "wait for it to finish")
            self._load_ids += 1
            rec = LoadRecord(self._load_ids, resolved.id, carry_kv=carry_kv, keep_standby=keep_standby)
            try:
                need = estimate_bytes(resolved, params, kv_bytes_per_token)
            except OSError as exc:
                need = 0
                rec.estimate = {"error": str(exc)}
            # a retired generation the reaper still holds is freed before this load allocates (see _load_thread)
            free = self._free_memory()
            chosen, why = choose_policy(policy, need, free + self.reaper.held_bytes if free > 0 else free,
                                        self.gen is not None)
            if carry_kv:
                chosen, why = "overlap", {**why, "why": "carry_kv installs once in-flight requests finish"}
            rec.policy, rec.estimate = chosen, {**rec.estimate, **why}
            self.loads[rec.id] = rec
            self.current_load = rec
        self._set_stage("reloading" if self.gen else "loading_model", 0.0)
        threading.Thread(target=self._load_thread, args=(rec, resolved, params, on_success),
                         name=f"hydrad-loader-{rec.id}", daemon=True).start()
        return rec

    def _free_memory(self) -> int:
        """Free memory where the weights go: the GPU's when one serves, else the host's."""
        try:
            gpus = [d for d in local_devices() if d.kind in GPU_KINDS]
            if gpus:
                return min(d.memory_free for d in gpus)
        except Exception:  # device enumeration is best effort; fall back to host memory
            pass
        return mem_available()

    async def abort_load(self) -> None:
        """Abort the running load (if any) and wait until its thread has ended."""
        rec = self.current_load
        if rec is None:
            return
        rec.abort.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(rec.wait(), 600)


    def _load_thread(self, rec: LoadRecord, resolved: ResolvedModel, params: RuntimeParams,
                     on_success: Callable[[], None] | None) -> None:
        name_os_thread()
        t0 = rec.run_t0 = time.monotonic()
        reloading = self.gen is not None
        last = [0.0]

        def progress(value: float) -> bool:
            rec.progress = value * 0.95
            if value - last[0] >= 0.05 or value >= 1.0:
                last[0] = value
                self._set_stage("reloading" if reloading else "loading_model", rec.progress)
            return not rec.abort.is_set()

        previous = (self.gen.resolved, self.gen.params) if self.gen is not None else None
        drained = False
        try:
            if rec.policy == "drain" and self.gen is not None:
                drained = True
                rec.phase = "draining"
                drain = Drain(rec)
                self._cmds.put(drain)
                drain.done.wait()
                rec.timings["drain_s"] = round(time.monotonic() - t0, 4)
            if rec.abort.is_set():
                raise llama.LoadAborted("superseded by a newer configure")
            rec.phase = "loading"
            if not self.reaper.wait(60):  # a generation the reaper still holds: its memory is wanted now
                log_event(log, logging.WARNING, "a retired generation is still being freed; loading beside it")
            log_event(log, logging.INFO, "loading model", load=rec.id, model=resolved.id, path=str(resolved.path),
                      policy=rec.policy)
            t1 = time.monotonic()
            beside = reloading and not drained  # a generation keeps serving while this one loads
            rec.threads_lent = self.load_threads if beside else 0
            gen = build_generation(resolved, params, progress, rec.id, on_warming=lambda: self._warming(rec, reloading),
                                   warm_threads=rec.threads_lent, beside=beside)
            rec.timings["load_s"] = round(time.monotonic() - t1, 4)
            # the parts of load_s, in order: weights, context (and embedder), warm-up
            rec.timings["model_s"] = round(gen.model_seconds, 4)
            rec.timings["context_s"] = round(gen.context_seconds, 4)
            rec.timings["warmup_s"] = round(gen.warmup_seconds, 4)
            if rec.abort.is_set():
                gen.free()
                raise llama.LoadAborted("superseded by a newer configure")
            rec.phase = "installing"
            t2 = time.monotonic()
            install = Install(gen, rec)
            self._cmds.put(install)
            install.fut.result()
            rec.timings["install_s"] = round(time.monotonic() - t2, 4)
            heap.settle()  # the new generation's Python side lives until the next load
            if on_success is not None:
                on_success()
        except Exception as exc:  # the old generation keeps serving (overlap); report and roll back the stage
            aborted = isinstance(exc, llama.LoadAborted)
            if drained and not aborted and previous is not None and self.gen is None:
                self._restore_previous(rec, previous)
            rec.phase, rec.error = ("aborted" if aborted else "failed"), str(exc)
            rec.seconds = round(time.monotonic() - t0, 3)
            if not aborted:
                self.last_error = f"load {rec.id} of {resolved.id} failed: {exc}"
            log_event(log, logging.WARNING if aborted else logging.ERROR,
                      "model load aborted" if aborted else "model load failed", load=rec.id, model=resolved.id,
                      error=str(exc))
            self._cmds.put(Resume())
            with self._lock:
                self.current_load = None
            self._set_stage("ready" if self.gen else "idle")
            rec.end()
            return
        if rec.seconds is None:  # the engine thread sets it when it installs (with the phase)
            rec.seconds = round(time.monotonic() - t0, 3)
        rec.phase, rec.progress = "done", 1.0
        self.stats.model_load_seconds = rec.timings.get("load_s", rec.seconds)
        self.stats.model_loads_total += 1
        self.last_error = None
        log_event(log, logging.INFO, "model ready", load=rec.id, model=resolved.id, seconds=rec.seconds,
                  policy=rec.policy)
        with self._lock:
            self.current_load = None
        self._set_stage("ready")
        rec.end()

    def _restore_previous(self, rec: LoadRecord, previous: tuple[ResolvedModel, RuntimeParams]) -> None:
        """Drain freed the old model before the new one failed: load the old one back so the engine
        serves again (sessions' KV is gone with it; the failure is still reported)."""
        resolved, params = previous
        log_event(log, logging.WARNING, "reloading the previous model after a failed load", load=rec.id,
                  model=resolved.id)
        try:
            gen = build_generation(resolved, params, lambda _v: True, rec.id, on_warming=lambda: None)
            install = Install(gen, LoadRecord(rec.id, resolved.id))
            self._cmds.put(install)
            install.fut.result()
            rec.timings["restored_previous"] = 1.0
        except Exception as exc:  # both failed: stay model-less and say so
            log_event(log, logging.ERROR, "previous model could not be restored", load=rec.id, error=str(exc))

    def _warming(self, rec: LoadRecord, reloading: bool) -> None:
        rec.phase, rec.progress = "warming", 0.97
        self._set_stage("reloading" if reloading else "warming", rec.progress)


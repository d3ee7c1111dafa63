"""The model of an engine and its changes. Loads run on a loader thread: the policy decision, the build of the next generation while
the current one serves, the hand-over to the engine thread, and the roll-back when it fails.

:class:`Loader` is the engine core's component that owns the model (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

from hydrad.common import heap
from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread
from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.engine import llama, weights
from hydrad.engine.commands import Abandon, Drain, Install, Rebuild, Resume
from hydrad.engine.fetch import FetchAborted, ModelFetcher
from hydrad.engine.generation import Generation, build_generation
from hydrad.engine.gpu import GPU_KINDS, local_devices
from hydrad.engine.loader import LoadRecord, choose_policy, estimate, mem_available
from hydrad.engine.reaper import Reaper
from hydrad.engine.kvops import carry_slots, sibling_problem
from hydrad.engine.peer_watch import PeerWatch
from hydrad.engine.requests import Failed


log = logging.getLogger("hydrad.engine")


class EngineBusy(RuntimeError):
    """Another load or rebuild is under way."""


class SlotsBusy(RuntimeError):
    """An expert-mode switch asked for while requests decode (it is refused, not queued)."""



class Loader:
    """Owns the model: the generation that serves, the older ones finishing their requests, the
    resident standby, the load records, and every change between them (load, install, rebuild,
    drain, abandon, switch, shutdown). ``load`` and ``abort_load`` run on the event loop, the load
    itself on its own thread, everything that changes a generation on the engine thread."""

    def __init__(self, core: Any, reaper: Reaper, load_threads: int, drain_timeout_s: float) -> None:  # the EngineCore this is part of (it imports us)
        self.core = core
        self.gen: Generation | None = None  # serves new requests
        self.retiring: list[Generation] = []  # older generations finishing their in-flight requests (overlap)
        self.standby: Generation | None = None  # the other expert placement, resident for a fast mode switch
        self.abandoned: list[Generation] = []  # set aside when a COMBINE peer died; never freed (see Abandon)
        self.reaper = reaper  # frees retired generations off the engine thread
        self.load_threads = load_threads  # CPU threads a load beside a serving generation takes from it
        self.drain_timeout_s = drain_timeout_s
        self.loads: dict[int, LoadRecord] = {}
        self.current_load: LoadRecord | None = None
        self.pending_swap: Any = None  # an install/rebuild/unload waiting for the slots to go idle
        self.drain: tuple[float, Drain] | None = None  # drain-policy reload in progress: (deadline, command)
        self._load_ids = 0
        self._lock = threading.Lock()  # guards current_load between the loader threads and the others
        self.fetcher: ModelFetcher | None = None  # fetches a model the disk lacks before its load (set once, at start)

    def busy(self) -> bool:
        """Whether a load, rebuild or swap is under way (a second one is refused)."""
        with self._lock:
            return self.current_load is not None or self.pending_swap is not None

    def load(self, resolved: ResolvedModel, params: RuntimeParams, on_success: Callable[[], None] | None = None,
             policy: str = "auto", carry_kv: bool = False, kv_bytes_per_token: int | None = None,
             keep_standby: bool = False) -> LoadRecord:
        """T3: load a model on a loader thread. ``overlap`` keeps the current generation serving until
        the new one takes over; ``drain`` frees it first; ``carry_kv`` moves every slot's KV across."""
        with self._lock:
            if self.current_load is not None or self.pending_swap is not None:
                raise EngineBusy(f"load {self.current_load.id if self.current_load else '?'} is under way; "
                                 "wait for it to finish")
            self._load_ids += 1
            rec = LoadRecord(self._load_ids, resolved.id, carry_kv=carry_kv, keep_standby=keep_standby)
            gpus = self._local_gpus()
            offloads = bool(gpus) and weights.gpu_count(params, len(gpus)) > 0 and params.n_gpu_layers != 0
            host_need = 0
            try:
                est = estimate(resolved, params, kv_bytes_per_token, len(gpus))
                rec.estimate = est.public()
                need, host_need = (est.device, est.host) if offloads else (est.device + est.host, 0)
            except OSError as exc:
                need = 0
                rec.estimate = {"error": str(exc)}
            # a retired generation the reaper still holds is freed before this load allocates (see _load_thread)
            free = min(d.memory_free for d in gpus) if offloads else mem_available()
            chosen, why = choose_policy(policy, need, free + self.reaper.held_bytes if free > 0 else free,
                                        self.gen is not None, host_need=host_need,
                                        host_free=mem_available() if host_need else 0)
            if carry_kv:
                chosen, why = "overlap", {**why, "why": "carry_kv installs once in-flight requests finish"}
            rec.policy, rec.estimate = chosen, {**rec.estimate, **why}
            self.loads[rec.id] = rec
            self.current_load = rec
        self.core.set_stage("reloading" if self.gen else "loading_model", 0.0)
        threading.Thread(target=self._load_thread, args=(rec, resolved, params, on_success),
                         name=f"hydrad-loader-{rec.id}", daemon=True).start()
        return rec

    def warm_estimate(self, resolved: ResolvedModel, params: RuntimeParams, kv_bytes_per_token: int | None) -> None:
        """Read the GGUF's tensor table and place its tensors (both remembered) so that :meth:`load`, which
        runs on the event loop, finds them: for a model with a large vocabulary the first read is tens of
        milliseconds of Python. Runs on a worker thread; a file that cannot be read is left to the load."""
        try:
            estimate(resolved, params, kv_bytes_per_token, len(self._local_gpus()))
        except (OSError, ValueError):
            pass

    @staticmethod
    def _local_gpus() -> list[Any]:
        """This engine's GPUs (ggml devices), for the estimate and their free memory; none when they cannot
        be listed (best effort: the estimate then counts host memory)."""
        try:
            return [d for d in local_devices() if d.kind in GPU_KINDS]
        except Exception:
            return []

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
                self.core.set_stage("reloading" if reloading else "loading_model", rec.progress)
            return not rec.abort.is_set()

        previous = (self.gen.resolved, self.gen.params) if self.gen is not None else None
        drained = False
        try:
            if rec.policy == "drain" and self.gen is not None:
                drained = True
                rec.phase = "draining"
                drain = Drain(rec)
                self.core.put(drain)
                drain.done.wait()
                rec.timings["drain_s"] = round(time.monotonic() - t0, 4)
            if rec.abort.is_set():
                raise llama.LoadAborted("superseded by a newer configure")
            resolved = self._fetched(rec, resolved, reloading)
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
            rec.weights = gen.load_view()
            if rec.abort.is_set():
                gen.free()
                raise llama.LoadAborted("superseded by a newer configure")
            rec.phase = "installing"
            t2 = time.monotonic()
            install = Install(gen, rec)
            self.core.put(install)
            install.fut.result()
            rec.timings["install_s"] = round(time.monotonic() - t2, 4)
            heap.settle()  # the new generation's Python side lives until the next load
            if on_success is not None:
                on_success()
        except Exception as exc:  # the old generation keeps serving (overlap); report and roll back the stage
            aborted = isinstance(exc, (llama.LoadAborted, FetchAborted))
            if drained and not aborted and previous is not None and self.gen is None:
                self._restore_previous(rec, previous)
            rec.phase, rec.error = ("aborted" if aborted else "failed"), str(exc)
            rec.seconds = round(time.monotonic() - t0, 3)
            if not aborted:
                self.core.last_error = f"load {rec.id} of {resolved.id} failed: {exc}"
            log_event(log, logging.WARNING if aborted else logging.ERROR,
                      "model load aborted" if aborted else "model load failed", load=rec.id, model=resolved.id,
                      error=str(exc))
            self.core.put(Resume())
            with self._lock:
                self.current_load = None
            self.core.set_stage("ready" if self.gen else "idle")
            rec.end()
            return
        if rec.seconds is None:  # the engine thread sets it when it installs (with the phase)
            rec.seconds = round(time.monotonic() - t0, 3)
        rec.phase, rec.progress = "done", 1.0
        self.core.stats.model_load_seconds = rec.timings.get("load_s", rec.seconds)
        self.core.stats.model_loads_total += 1
        self.core.last_error = None
        log_event(log, logging.INFO, "model ready", load=rec.id, model=resolved.id, seconds=rec.seconds,
                  policy=rec.policy)
        with self._lock:
            self.current_load = None
        self.core.set_stage("ready")
        rec.end()

    def _fetched(self, rec: LoadRecord, resolved: ResolvedModel, reloading: bool) -> ResolvedModel:
        """On the loader thread: the model's file, fetched first when the disk lacks it (``rec.fetch`` and
        the engine's stage report the transfer); a fetched file this load uses becomes the most recently
        used. FetchError / FetchAborted end the load like any failure / abort."""
        fetcher = self.fetcher
        if not resolved.fetch:
            if fetcher is not None:
                with contextlib.suppress(OSError):
                    fetcher.cache.touch(resolved.path)
            return resolved
        if fetcher is None:
            raise RuntimeError(f"model '{resolved.id}' is not on disk and this engine fetches no models")
        rec.phase = "fetching"
        stage = "reloading" if reloading else "loading_model"

        def report(figures: dict[str, Any]) -> None:
            rec.fetch = figures
            self.core.set_stage(stage, 0.0)

        in_use = [g.resolved.path for g in (self.gen, self.standby, *self.retiring) if g is not None]
        t0 = time.monotonic()
        rec.fetch = {"bytes": 0, "total": resolved.entry.size_bytes if resolved.entry else None}
        fetcher.fetch(resolved, report, rec.abort, in_use)
        rec.timings["fetch_s"] = round(time.monotonic() - t0, 4)
        return dataclasses.replace(resolved, fetch=False)

    def _restore_previous(self, rec: LoadRecord, previous: tuple[ResolvedModel, RuntimeParams]) -> None:
        """Drain freed the old model before the new one failed: load the old one back so the engine
        serves again (sessions' KV is gone with it; the failure is still reported)."""
        resolved, params = previous
        log_event(log, logging.WARNING, "reloading the previous model after a failed load", load=rec.id,
                  model=resolved.id)
        try:
            gen = build_generation(resolved, params, lambda _v: True, rec.id, on_warming=lambda: None)
            install = Install(gen, LoadRecord(rec.id, resolved.id))
            self.core.put(install)
            install.fut.result()
            rec.timings["restored_previous"] = 1.0
        except Exception as exc:  # both failed: stay model-less and say so
            log_event(log, logging.ERROR, "previous model could not be restored", load=rec.id, error=str(exc))

    def _warming(self, rec: LoadRecord, reloading: bool) -> None:
        rec.phase, rec.progress = "warming", 0.97
        self.core.set_stage("reloading" if reloading else "warming", rec.progress)

    def retire_idle(self) -> None:
        for old in [g for g in self.retiring if not g.n_active]:
            self.retiring.remove(old)
            self.bury(old, "its last request ended")

    def bury(self, gen: Generation, why: str) -> None:
        """Hand a generation no slot uses any more to the reaper (freed on its thread, not this one)."""
        if gen in self.core.scheduler.unsynced:  # its last step may still compute: done before anyone frees it
            self.core.scheduler.unsynced.discard(gen)
            gen.ctx.synchronize()
        self.reaper.bury(gen, gen.tag.fingerprint, why, gen.model.info.size_bytes)

    def drain_step(self) -> None:
        """Drain policy: once in-flight requests are done (or the bound passed), free the generation."""
        if self.drain is None:
            return
        deadline, cmd = self.drain
        gen = self.gen
        if gen is not None and gen.n_active and time.monotonic() < deadline and not cmd.rec.abort.is_set():
            return
        if gen is not None:
            self.core.scheduler.settle_text()
            for slot in gen.slots:
                if slot.active is not None:
                    self.core.emit(slot.active.handle, Failed(
                        f"ended by a model reload after {self.drain_timeout_s:.0f}s of draining; retry", status=503,
                        code="reloading"))
                    self.core.scheduler.release(gen, slot)
            self.gen = None
            gen.free()
            self.core.publish()
        self.drain = None
        cmd.done.set()

    def maybe_swap(self) -> None:
        """Apply a pending install/rebuild/unload. An overlap install takes over at once (the old generation
        retires when its in-flight requests end); the others wait until no slot is active."""
        cmd = self.pending_swap
        if cmd is None:
            return
        overlap = isinstance(cmd, Install) and not cmd.rec.carry_kv
        if not overlap and self.gen is not None and self.gen.n_active:
            return
        self.pending_swap = None
        try:
            result: Any = None
            if isinstance(cmd, Install):
                new, rec = cmd.gen, cmd.rec
                if rec.carry_kv and self.gen is not None:
                    problem = sibling_problem(self.gen, new)
                    if problem:
                        new.free()
                        raise RuntimeError(problem)
                old, self.gen = self.gen, new
                self.core.params = new.params
                self._watch_peers(new)
                if self.standby is not None:  # a standby of the placement this one replaces, or stale
                    self.standby.free()
                    self.standby = None
                if old is not None:
                    if rec.carry_kv:
                        rec.carried = carry_slots(old, new)
                    if old.n_active:
                        self.retiring.append(old)
                    elif rec.keep_standby:
                        self.standby = old
                    else:
                        self.bury(old, "replaced while idle")
                # done from the moment the model serves: a client that sees /health turn 200 and then asks
                # /control/loads/{id} must not find the load still "installing" (the loader thread writes
                # the rest of the record when it wakes)
                rec.phase, rec.progress = "done", 1.0
                if rec.run_t0 is not None:
                    rec.seconds = round(time.monotonic() - rec.run_t0, 3)
                self.core.publish()
            elif isinstance(cmd, Rebuild):
                t0 = time.monotonic()
                assert self.gen is not None
                if self.standby is not None:  # its context no longer matches the parameters in force
                    self.standby.free()
                    self.standby = None
                carried = self.gen.rebuild_context(cmd.params)
                self.core.params = cmd.params
                result = {"seconds": time.monotonic() - t0, **carried}
                self.core.stats.context_rebuilds_total += 1
                self.core.publish()
            else:
                self.shutdown()
                self.core.set_stage("idle")
            cmd.fut.set_result(result)
        except Exception as exc:
            cmd.fut.set_exception(exc)

    def _watch_peers(self, gen: Generation) -> None:
        """A generation that computes on peers gets a watch of them (see peer_watch)."""
        peers = gen.placement.peers if gen.placement is not None else []
        if not peers:
            return

        def lost(endpoint: str, reason: str) -> None:  # on a watch thread
            message = f"COMBINE peer {endpoint} lost: {reason}"
            self.core.put(Abandon(gen.id, message))
            if self.core.on_peer_lost is not None:
                self.core.on_peer_lost(message)

        gen.watch = PeerWatch([p.endpoint for p in peers], lost)
        gen.watch.start()

    def abandon(self, gen_id: int, reason: str) -> None:
        if self.standby is not None and self.standby.id == gen_id:
            self.standby.abandoned = True
            self.abandoned.append(self.standby)
            self.standby = None
            self.core.stats.peer_losses_total += 1
            log_event(log, logging.WARNING, "standby generation set aside: its COMBINE peer is gone", generation=gen_id,
                      reason=reason)
            self.core.publish()
            return
        for gen in ([self.gen] if self.gen else []) + self.retiring:
            if gen.id != gen_id:
                continue
            self.core.scheduler.settle_text()
            for slot in gen.slots:
                if slot.active is not None:
                    self.core.emit(slot.active.handle, Failed(reason, status=503, code="peer_lost"))
                    self.core.scheduler.release(gen, slot)
            gen.abandoned = True
            if gen is self.gen:  # the resident other placement (SOLO, say) takes over at once, if there is one
                self.gen, self.standby = self.standby, None
                if self.gen is not None:
                    self.core.params = self.gen.params
                self.core.kv.buffers.clear()
            else:
                self.retiring.remove(gen)
            self.abandoned.append(gen)
            self.core.stats.peer_losses_total += 1
            self.core.last_error = reason
            log_event(log, logging.ERROR, "generation set aside: its COMBINE peer is gone", generation=gen.id,
                      model=gen.resolved.id, reason=reason)
            if self.gen is None and self.current_load is None:
                self.core.set_stage("idle")
            self.core.publish()
            return

    def switch_standby(self, fut: Any) -> None:
        """Engine thread: exchange the serving generation and the standby (both stay resident)."""
        gen, standby = self.gen, self.standby
        if gen is None or standby is None:
            fut.set_exception(RuntimeError("no resident generation of the other placement"))
            return
        if gen.n_active or self.retiring:
            fut.set_exception(SlotsBusy(f"{gen.n_active + sum(g.n_active for g in self.retiring)} request(s) "
                                        "decoding; switch between requests"))
            return
        self.gen, self.standby = standby, gen
        self.core.params = standby.params
        self.core.kv.buffers.clear()
        self.core.publish()
        fut.set_result(standby.params)

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.core.scheduler.settle_device()
        self.core.kv.buffers.clear()
        gen, self.gen = self.gen, None
        standby, self.standby = self.standby, None
        for g in ([gen] if gen else []) + ([standby] if standby else []) + self.retiring:
            g.free()
        self.retiring.clear()
        if not self.reaper.wait(60):
            log_event(log, logging.WARNING, "a retired generation is still being freed at shutdown")
        if self.drain is not None:
            self.drain[1].done.set()
            self.drain = None


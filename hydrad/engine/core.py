"""The engine core: one thread owns llama.cpp and runs continuous batching over all slots.

Async code never touches llama.cpp. It sends commands on a queue; the engine thread admits
requests into free slots between steps, puts every active sequence into one ``llama_decode``
per step, samples in llama.cpp's sampler chains, and hands the step's events back to the
event loop in one ``call_soon_threadsafe`` (not one wake-up per token). Model loads run on a
loader thread so the current generation keeps serving while the next one is built.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from hydrad.engine import faults, llama
from hydrad.engine.gpu import GPU_KINDS, local_devices
from hydrad.engine.generation import Generation, Slot, build_generation
from hydrad.engine.statebuf import StateBuffers
from hydrad.engine.loader import LoadRecord, choose_policy, estimate_bytes, mem_available
from hydrad.engine.requests import (
    Done, Failed, RequestHandle, Token, Usage,
)
from hydrad.engine.stats import EngineStats
from hydrad.engine.textstream import StopMatcher, Utf8Detokenizer
from hydrad.common.logs import log_event
from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.wire.requests import GenRequest

log = logging.getLogger("hydrad.engine")



PRETOKENIZE_CHARS = 32 << 10
"""Prompts longer than this are tokenized on a worker thread before they reach the engine
thread: tokenizing 50 MB on the engine thread stalled every stream for about 22 s."""

MAX_CHARS_PER_TOKEN = 64
"""A prompt with more characters than this times the context cannot fit (no tokenizer of the
supported families averages more than a few characters a token): refused before tokenizing."""


class EngineBusy(RuntimeError):
    """Another load or rebuild is under way."""


@dataclass
class _Active:
    """A request occupying a slot."""

    handle: RequestHandle
    prompt_len: int
    cached: int
    pending: list[int]
    max_tokens: int
    sampler: llama.Sampler
    detok: Utf8Detokenizer
    stopper: StopMatcher
    t_start: float
    t_first: float = 0.0
    n_gen: int = 0
    next_token: int = -1
    unsent: list[int] = field(default_factory=list)  # sampled, not yet turned into text (text_overlap)
    faulty: frozenset[str] = frozenset()  # fault-injection tests: stages at which this request fails


class EngineCore:
    def __init__(self, on_status: Callable[[str, float | None], None] | None = None, max_queue: int = 64) -> None:
        self.stats = EngineStats()
        self.stage = "starting"
        self.progress: float | None = None
        self.params: RuntimeParams | None = None  # T1 defaults in force
        self.gen: Generation | None = None  # serves new requests
        self.retiring: list[Generation] = []  # older generations finishing their in-flight requests (overlap)
        self.loads: dict[int, LoadRecord] = {}
        self.current_load: LoadRecord | None = None
        self.last_error: str | None = None
        self.admitting = True
        self.max_queue = max_queue
        self.heartbeat = time.monotonic()
        self._on_status = on_status
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cmds: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._waiting: deque[RequestHandle] = deque()
        self._out: list[tuple[RequestHandle, Any]] = []
        self.state_buffers = StateBuffers()  # KV state snapshots and uploads; any thread may take one
        self._deferred: list[tuple[Generation, Slot, _Active]] = []  # text to make while the device computes
        self._pending_swap: tuple[str, Any, cf.Future[Any]] | None = None
        self._drain: tuple[float, threading.Event, LoadRecord] | None = None  # drain-policy reload in progress
        self.drain_timeout_s = 30.0
        self._thread: threading.Thread | None = None
        self._load_ids = 0
        self._lock = threading.Lock()  # guards stage/current_load between loader and loop threads
        self._faults = faults.armed()  # False outside fault-injection tests

    # ----- event-loop side -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hydrad-engine", daemon=True)
        self._thread.start()
        self._set_stage("idle")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def submit(self, request: GenRequest) -> RequestHandle:
        handle = RequestHandle(request)
        self._cmds.put(("submit", handle))
        return handle

    async def prepare(self, request: GenRequest) -> None:
        """Work a request needs before the engine thread sees it, done off that thread: a prompt
        too long for the context by its length alone is refused (:class:`PromptTooLong`), and a
        large one is tokenized on a worker thread so it cannot stall the streams being decoded."""
        gen = self.gen
        if gen is None:
            return
        chars = len(request.prompt or "") + sum(len(m.get("content") or "") for m in request.messages or ())
        limit = gen.ctx.n_ctx_seq
        if chars > limit * MAX_CHARS_PER_TOKEN:
            raise PromptTooLong(f"the prompt has {chars} characters, more than this engine's context of {limit} "
                                "tokens can hold")
        if chars < PRETOKENIZE_CHARS:
            return
        try:
            tokens = await asyncio.to_thread(self._tokenize, gen, request)
        except llama.ModelFreed:
            return  # a reload retired that model meanwhile: the engine thread tokenizes for the new one
        request.tokens, request.tokens_for = tokens, gen.id

    def _tokenize(self, gen: Generation, request: GenRequest) -> list[int]:
        """A request's prompt tokens for ``gen`` (any thread: tokenizing only reads the vocabulary)."""
        params = self.params or gen.params
        if request.messages is not None:
            try:
                tokens = gen.model.chat_tokens(request.messages, params.chat_template)
            except ValueError as exc:
                raise _RequestError(str(exc), 400, "template_error") from None
        else:
            tokens = gen.model.tokenize(request.prompt or "", add_special=True, parse_special=True)
        bos = gen.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def cancel(self, handle: RequestHandle) -> None:
        if not handle.finished:
            self._cmds.put(("cancel", handle))

    def set_defaults(self, params: RuntimeParams) -> None:
        """T1: per-request defaults change at once; nothing is rebuilt."""
        self._cmds.put(("t1", params))

    async def rebuild_context(self, params: RuntimeParams) -> dict[str, Any]:
        """T2: rebuild the context (in-flight requests finish first), carrying slots' KV where it fits.
        Returns seconds taken and how many slots were carried or dropped."""
        if self.gen is None:
            self.params = params
            return {"seconds": 0.0, "carried": 0, "dropped": 0}
        with self._lock:
            if self.current_load is not None or self._pending_swap is not None:
                raise EngineBusy("a model load or context rebuild is under way; try again when it ends")
        fut: cf.Future[Any] = cf.Future()
        self._cmds.put(("rebuild", params, fut))
        return await asyncio.wrap_future(fut)

    def load(self, resolved: ResolvedModel, params: RuntimeParams, on_success: Callable[[], None] | None = None,
             policy: str = "auto", carry_kv: bool = False, kv_bytes_per_token: int | None = None) -> LoadRecord:
        """T3: load a model on a loader thread. ``overlap`` keeps the current generation serving until
        the new one takes over; ``drain`` frees it first; ``carry_kv`` moves every slot's KV across."""
        with self._lock:
            if self.current_load is not None or self._pending_swap is not None:
                raise EngineBusy(f"load {self.current_load.id if self.current_load else '?'} is under way; "
                                 "wait for it to finish")
            self._load_ids += 1
            rec = LoadRecord(self._load_ids, resolved.id, carry_kv=carry_kv)
            try:
                need = estimate_bytes(resolved, params, kv_bytes_per_token)
            except OSError as exc:
                need = 0
                rec.estimate = {"error": str(exc)}
            chosen, why = choose_policy(policy, need, self._free_memory(), self.gen is not None)
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
        await asyncio.to_thread(rec.ended.wait, 600)

    async def unload(self) -> None:
        fut: cf.Future[Any] = cf.Future()
        self._cmds.put(("unload", None, fut))
        await asyncio.wrap_future(fut)

    def stop(self) -> None:
        """Ask the engine thread to end remaining requests, free llama.cpp and exit."""
        self.admitting = False
        self._cmds.put(("stop",))

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_stage(self, stage: str, progress: float | None = None) -> None:
        changed = stage != self.stage
        self.stage = stage
        self.progress = progress
        if changed:
            log_event(log, logging.INFO, "stage", stage=stage)
        if self._on_status is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_status, stage, progress)
            except RuntimeError:  # loop closed during shutdown
                pass

    def _deliver(self, batch: list[tuple[RequestHandle, Any]]) -> None:
        for handle, ev in batch:
            handle.queue.put_nowait(ev)

    # ----- loader thread ---------------------------------------------------------------

    def _load_thread(self, rec: LoadRecord, resolved: ResolvedModel, params: RuntimeParams,
                     on_success: Callable[[], None] | None) -> None:
        t0 = time.monotonic()
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
                done = threading.Event()
                self._cmds.put(("drain", rec, done))
                done.wait()
                rec.timings["drain_s"] = round(time.monotonic() - t0, 4)
            if rec.abort.is_set():
                raise llama.LoadAborted("superseded by a newer configure")
            rec.phase = "loading"
            log_event(log, logging.INFO, "loading model", load=rec.id, model=resolved.id, path=str(resolved.path),
                      policy=rec.policy)
            t1 = time.monotonic()
            gen = build_generation(resolved, params, progress, rec.id, on_warming=lambda: self._warming(rec, reloading))
            rec.timings["load_s"] = round(time.monotonic() - t1, 4)
            if rec.abort.is_set():
                gen.free()
                raise llama.LoadAborted("superseded by a newer configure")
            rec.phase = "installing"
            t2 = time.monotonic()
            fut: cf.Future[Any] = cf.Future()
            self._cmds.put(("install", (gen, rec), fut))
            fut.result()
            rec.timings["install_s"] = round(time.monotonic() - t2, 4)
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
            self._cmds.put(("resume",))
            with self._lock:
                self.current_load = None
            self._set_stage("ready" if self.gen else "idle")
            rec.ended.set()
            return
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
        rec.ended.set()

    def _restore_previous(self, rec: LoadRecord, previous: tuple[ResolvedModel, RuntimeParams]) -> None:
        """Drain freed the old model before the new one failed: load the old one back so the engine
        serves again (sessions' KV is gone with it; the failure is still reported)."""
        resolved, params = previous
        log_event(log, logging.WARNING, "reloading the previous model after a failed load", load=rec.id,
                  model=resolved.id)
        try:
            gen = build_generation(resolved, params, lambda _v: True, rec.id, on_warming=lambda: None)
            fut: cf.Future[Any] = cf.Future()
            self._cmds.put(("install", (gen, LoadRecord(rec.id, resolved.id)), fut))
            fut.result()
            rec.timings["restored_previous"] = 1.0
        except Exception as exc:  # both failed: stay model-less and say so
            log_event(log, logging.ERROR, "previous model could not be restored", load=rec.id, error=str(exc))

    def _warming(self, rec: LoadRecord, reloading: bool) -> None:
        rec.phase, rec.progress = "warming", 0.97
        self._set_stage("reloading" if reloading else "warming", rec.progress)

    # ----- engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if not self._drain_commands(block=not self._busy()):
                    break
                self.heartbeat = time.monotonic()
                self._maybe_swap()
                self._drain_step()
                self._expire_waiting()
                self._admit()
                for old in [g for g in self.retiring if g.n_active]:
                    self._step(old)
                if self.gen is not None and self.gen.n_active:
                    self._step(self.gen)
                self._retire_idle()
                self.state_buffers.trim()
                self._flush()
        except BaseException as exc:  # the engine is dead: every caller must hear it, not hang
            log.exception("engine thread died")
            self.last_error = f"engine thread died: {exc}"
            self._fail_all(f"engine failed: {exc}", engine_failed=True)
            self._flush()
            raise
        finally:
            self._shutdown_gen()

    def _busy(self) -> bool:
        gen = self.gen
        if any(g.n_active for g in self.retiring):
            return True
        if gen is None:
            return False
        return bool(gen.n_active or (self._waiting and gen.free_slot_exists() and self._pending_swap is None
                                     and self._drain is None))

    def _retire_idle(self) -> None:
        for old in [g for g in self.retiring if not g.n_active]:
            self.retiring.remove(old)
            old.free()
            log_event(log, logging.INFO, "generation retired", generation=old.tag.fingerprint)

    def _drain_step(self) -> None:
        """Drain policy: once in-flight requests are done (or the bound passed), free the generation."""
        if self._drain is None:
            return
        deadline, done, rec = self._drain
        gen = self.gen
        if gen is not None and gen.n_active and time.monotonic() < deadline and not rec.abort.is_set():
            return
        if gen is not None:
            self._settle_text()
            for slot in gen.slots:
                if slot.active is not None:
                    self._emit(slot.active.handle, Failed(
                        f"ended by a model reload after {self.drain_timeout_s:.0f}s of draining; retry", status=503,
                        code="reloading"))
                    self._release(gen, slot)
            self.gen = None
            gen.free()
        self._drain = None
        done.set()

    def _expire_waiting(self) -> None:
        """Requests queued while no generation admits them wait at most reload_queue_timeout_s."""
        if not self._waiting or (self.gen is not None and self._drain is None):
            return
        limit = (self.params.reload_queue_timeout_s if self.params else 30.0)
        now = time.monotonic()
        keep: deque[RequestHandle] = deque()
        for h in self._waiting:
            if now - h.t_enqueued > limit:
                self._emit(h, Failed(f"the engine is loading a model; waited {limit:.0f}s, retry later", status=503,
                                     code="reloading"))
            else:
                keep.append(h)
        self._waiting = keep

    def _drain_commands(self, block: bool) -> bool:
        try:
            cmd = self._cmds.get(timeout=0.25) if block else self._cmds.get_nowait()
        except queue.Empty:
            return True
        while True:
            if not self._handle(cmd):
                return False
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, cmd: tuple[Any, ...]) -> bool:
        kind = cmd[0]
        if kind == "submit":
            handle: RequestHandle = cmd[1]
            if not self.admitting:
                self._emit(handle, Failed("engine is shutting down", status=503, code="shutting_down"))
            elif self.gen is None and self.current_load is None:
                self._emit(handle, Failed("no model is loaded", status=503, code="no_model"))
            elif len(self._waiting) >= self.max_queue and not (self.gen and self.gen.free_slot_exists()):
                self._emit(handle, Failed("all slots busy and the queue is full", status=503, code="queue_full"))
            else:
                handle.t_enqueued = time.monotonic()
                self._waiting.append(handle)
                self.stats.requests_total += 1
        elif kind == "cancel":
            self._cancel(cmd[1])
        elif kind == "t1":
            self.params = cmd[1]
        elif kind == "state_get":
            self._state_get(cmd[1], cmd[2])
        elif kind == "state_put":
            self._state_put(cmd[1], cmd[2], cmd[3], cmd[4], *cmd[5:])  # cmd[5]: trusted (security: foreign slots)
        elif kind in ("rebuild", "install", "unload"):
            self._pending_swap = (kind, cmd[1], cmd[2])
        elif kind == "drain":
            self._drain = (time.monotonic() + self.drain_timeout_s, cmd[2], cmd[1])
        elif kind == "resume":
            pass  # wakes the loop so queued requests are re-examined
        elif kind == "stop":
            self._fail_all("engine is shutting down", engine_failed=True, status=503, code="shutting_down")
            self._flush()
            return False
        return True

    def _idle_slot(self, slot_id: int) -> tuple[Generation, Slot]:
        gen = self.gen
        if gen is None:
            raise StateError("no model is loaded", "not_found")
        if not 0 <= slot_id < len(gen.slots):
            raise StateError(f"slot {slot_id} does not exist (this engine has {len(gen.slots)})", "not_found")
        slot = gen.slots[slot_id]
        if slot.active is not None:
            raise StateError(f"slot {slot_id} is busy with a request; retry when it is idle", "conflict")
        return gen, slot

    def _state_get(self, slot_id: int, fut: cf.Future[Any]) -> None:
        try:
            gen, slot = self._idle_slot(slot_id)
            data = gen.read_state(slot, self.state_buffers)
            fut.set_result((gen.state_meta(slot, len(data)), data))
        except Exception as exc:
            fut.set_exception(exc)

    def _state_put(self, slot_id: int, meta: dict[str, Any], data: Any, fut: cf.Future[Any], trusted: bool = False) -> None:
        try:
            gen, slot = self._idle_slot(slot_id)
            problem = gen.incompatibility(meta)
            if problem:
                raise StateError(problem, "incompatible")
            t0 = time.monotonic()
            gen.write_state(slot, meta["tokens"], data, foreign=not trusted)  # untrusted KV: see Slot.foreign
            slot.last_used = time.monotonic()
            fut.set_result({"slot": slot_id, "n_tokens": len(slot.cache), "seconds": round(time.monotonic() - t0, 6)})
        except Exception as exc:
            fut.set_exception(exc)

    def check_put(self, slot_id: int, meta: Any, max_bytes: int) -> StateError | None:
        """Cheap checks before any state byte is accepted, so a doomed upload is refused up front."""
        gen = self.gen
        if gen is None:
            return StateError("no model is loaded", "not_found")
        if not 0 <= slot_id < len(gen.slots):
            return StateError(f"slot {slot_id} does not exist (this engine has {len(gen.slots)})", "not_found")
        problem = gen.incompatibility(meta)
        if problem:
            return StateError(problem, "incompatible")
        size = meta.get("bytes")
        if not isinstance(size, int) or not 0 < size <= max_bytes:
            return StateError(f"meta.bytes must be 1..{max_bytes}, got {size!r}", "too_large")
        return None

    async def state_get(self, slot_id: int) -> tuple[dict[str, Any], Any]:
        """A slot's KV state (meta, bytes), read on the engine thread between steps."""
        fut: cf.Future[Any] = cf.Future()
        self._cmds.put(("state_get", slot_id, fut))
        return await asyncio.wrap_future(fut)

    async def state_put(self, slot_id: int, meta: dict[str, Any], data: Any, trusted: bool = False) -> dict[str, Any]:
        """Restore a slot from meta + bytes; an incompatible state leaves the slot untouched."""
        fut: cf.Future[Any] = cf.Future()
        self._cmds.put(("state_put", slot_id, meta, data, fut, trusted))
        return await asyncio.wrap_future(fut)

    def _maybe_swap(self) -> None:
        """Apply a pending install/rebuild/unload. An overlap install takes over at once (the old generation
        retires when its in-flight requests end); the others wait until no slot is active."""
        if self._pending_swap is None:
            return
        kind, arg, fut = self._pending_swap
        overlap = kind == "install" and not arg[1].carry_kv
        if not overlap and self.gen is not None and self.gen.n_active:
            return
        self._pending_swap = None
        try:
            if kind == "install":
                new, rec = arg
                if rec.carry_kv and self.gen is not None:
                    problem = sibling_problem(self.gen, new)
                    if problem:
                        new.free()
                        raise RuntimeError(problem)
                old, self.gen = self.gen, new
                self.params = new.params
                if old is not None:
                    if rec.carry_kv:
                        rec.carried = carry_slots(old, new)
                    if old.n_active:
                        self.retiring.append(old)
                    else:
                        old.free()
                result: Any = None
            elif kind == "rebuild":
                t0 = time.monotonic()
                assert self.gen is not None
                carried = self.gen.rebuild_context(arg)
                self.params = arg
                result = {"seconds": time.monotonic() - t0, **carried}
                self.stats.context_rebuilds_total += 1
            else:
                self._shutdown_gen()
                self._set_stage("idle")
                result = None
            fut.set_result(result)
        except Exception as exc:
            fut.set_exception(exc)

    def _admit(self) -> None:
        gen = self.gen
        if gen is None or self._pending_swap is not None or self._drain is not None or not self._waiting:
            return
        deferred: deque[RequestHandle] = deque()
        while self._waiting:
            handle = self._waiting.popleft()
            want = handle.request.slot
            if want is not None and not 0 <= want < len(gen.slots):
                self._emit(handle, Failed(f"slot {want} does not exist (this engine has {len(gen.slots)})",
                                          status=400, code="invalid_slot"))
                continue
            if (want is not None and gen.slots[want].active is not None) or not gen.free_slot_exists():
                deferred.append(handle)
                continue
            try:
                self._start(gen, handle)
            except _RequestError as exc:
                self._emit(handle, Failed(str(exc), status=exc.status, code=exc.code))
            except Exception as exc:  # the request's own failure: it alone ends, the engine goes on
                self._request_failed(gen, handle, "admitting", exc)
        self._waiting = deferred

    def _start(self, gen: Generation, handle: RequestHandle) -> None:
        req = handle.request
        params = self.params or gen.params
        model = gen.model
        faulty = faults.stages_of(req) if self._faults else faults.NONE
        self._fault("admit", faulty)
        if req.tokens is not None and req.tokens_for == gen.id:
            tokens = req.tokens
        else:
            self._fault("tokenize", faulty)
            tokens = self._tokenize(gen, req)
        req.tokens = None  # not needed any more; a queued copy of a long prompt is memory
        if not tokens:
            raise _RequestError("the prompt is empty", 400, "empty_prompt")
        limit = gen.ctx.n_ctx_seq
        if len(tokens) >= limit:
            raise _RequestError(f"the prompt has {len(tokens)} tokens; this engine's context holds {limit}",
                                400, "context_length_exceeded")
        slot = gen.slots[req.slot] if req.slot is not None else gen.pick_slot(tokens if params.cache_prompt else None)
        keep = gen.reuse_prefix(slot, tokens) if params.cache_prompt else gen.reset_slot(slot)
        gen.ensure_room(len(tokens) - keep, exclude=slot)
        s = req.sampling
        sampler = llama.Sampler(llama.Sampling(
            temperature=params.temperature if s.temperature is None else s.temperature,
            top_k=params.top_k if s.top_k is None else s.top_k,
            top_p=params.top_p if s.top_p is None else s.top_p,
            min_p=params.min_p if s.min_p is None else s.min_p,
            repeat_penalty=params.repeat_penalty if s.repeat_penalty is None else s.repeat_penalty,
            repeat_last_n=params.repeat_last_n,
            frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
            seed=params.seed if s.seed is None else s.seed,
            ban=tuple(model.eog_tokens()) if req.ignore_eos else ()), model.n_vocab, limit)
        room = limit - len(tokens)
        if req.max_tokens is not None:
            max_tokens = min(req.max_tokens, room)
        elif params.n_predict >= 0:
            max_tokens = min(params.n_predict, room)
        else:
            max_tokens = room
        handle.generation = gen.tag
        try:
            stopper = StopMatcher(req.stop)
        except ValueError as exc:
            sampler.free()
            raise _RequestError(str(exc), 400, "invalid_stop") from None
        slot.active = _Active(handle=handle, prompt_len=len(tokens), cached=keep, pending=tokens[keep:],
                              max_tokens=max_tokens, sampler=sampler, detok=Utf8Detokenizer(),
                              stopper=stopper, t_start=time.monotonic(), faulty=faulty)
        gen.n_active += 1
        self.stats.prompt_tokens_total += len(tokens) - keep
        self.stats.cached_tokens_total += keep
        if max_tokens <= 0:
            self._finish(gen, slot, "length")

    def _step(self, gen: Generation) -> None:
        batch, ctx = gen.batch, gen.ctx
        batch.clear()
        outputs: list[tuple[Slot, int]] = []
        before: list[tuple[Slot, int]] = []
        budget = batch.capacity
        for slot in gen.slots:
            a = slot.active
            if a is not None and a.next_token >= 0:
                before.append((slot, len(slot.cache)))
                outputs.append((slot, batch.add(a.next_token, len(slot.cache), slot.id, True)))
                slot.cache.append(a.next_token)
                a.next_token = -1
                budget -= 1
        n_prefill = 0
        for slot in gen.slots:
            a = slot.active
            if a is None or not a.pending or budget <= 0:
                continue
            take = a.pending[:budget]
            before.append((slot, len(slot.cache)))
            last = len(take) == len(a.pending)
            idx = batch.add_run(take, len(slot.cache), slot.id, last)
            slot.cache.extend(take)
            del a.pending[:len(take)]
            budget -= len(take)
            n_prefill += len(take)
            if last:
                outputs.append((slot, idx))
        if batch.n == 0:
            self._settle_text()
            return
        rc = batch.decode(ctx)
        self.stats.n_decode_total += 1
        if rc == 1 and gen.evict_idle():  # KV pool full: free idle slots' caches and try the step again
            rc = batch.decode(ctx)
            self.stats.n_decode_total += 1
        if self._deferred:  # the device computes this step meanwhile; the first sample below waits for it
            self._settle_text()
            self._flush()
        if rc != 0:
            self._decode_failed(gen, rc, before)
            return
        now = time.monotonic()
        overlap = self._text_overlap(gen)
        for slot, idx in outputs:
            a = slot.active
            if a is None:  # a stop string found while the device computed ended it: the row is discarded
                continue
            try:
                self._fault("sample", a.faulty)
                tok = a.sampler.sample(ctx, idx)
                if a.n_gen == 0:
                    a.t_first = now
                    a.handle.t_first_token = now
                self._on_token(gen, slot, a, tok, overlap and a.n_gen > 0)
            except Exception as exc:  # this request's failure, not the step's: the other slots go on
                if slot.active is a:
                    self._request_failed(gen, a.handle, "sampling", exc, slot)

    def _text_overlap(self, gen: Generation) -> bool:
        mode = (self.params or gen.params).text_overlap
        return mode == "on" or (mode == "auto" and gen.asynchronous)

    def _on_token(self, gen: Generation, slot: Slot, a: _Active, tok: int, defer: bool) -> None:
        """Token-level decisions now (end of generation, length); the text now, or once the next
        step is on the device when ``defer`` (the first token never waits: it is the TTFT)."""
        if gen.model.is_eog(tok):
            self._finish(gen, slot, "stop")
            return
        a.n_gen += 1
        self.stats.tokens_predicted_total += 1
        a.unsent.append(tok)
        if a.n_gen >= a.max_tokens or len(slot.cache) + 1 >= gen.ctx.n_ctx_seq:
            self._finish(gen, slot, "length")
            return
        if defer:
            a.next_token = tok
            self._deferred.append((gen, slot, a))
        elif not self._text(gen, slot, a):
            a.next_token = tok

    def _text(self, gen: Generation, slot: Slot, a: _Active) -> bool:
        """Detokenize ``a``'s unsent tokens, stream the text out, watch for stop strings; True when
        a stop string ended the request."""
        tokens, a.unsent = a.unsent, []
        model = gen.model
        for tok in tokens:
            self._fault("detokenize", a.faulty)
            text = a.detok.push(model.piece(tok))
            if not text:
                continue
            self._fault("stop", a.faulty)
            out, stopped = a.stopper.push(text)
            if out:
                self._emit(a.handle, Token(out))
            if stopped:
                self._finish(gen, slot, "stop", flush=False)
                return True
        return False

    def _settle_text(self) -> None:
        """The deferred text of the last step, for requests still running (a cancelled one's is dropped)."""
        deferred, self._deferred = self._deferred, []
        for gen, slot, a in deferred:
            if slot.active is a and a.unsent:
                try:
                    self._text(gen, slot, a)
                except Exception as exc:
                    if slot.active is a:
                        self._request_failed(gen, a.handle, "making text", exc, slot)

    def _finish(self, gen: Generation, slot: Slot, reason: str, flush: bool = True) -> None:
        a = slot.active
        assert a is not None
        if flush:
            self._fault("finish", a.faulty)
            if a.unsent and self._text(gen, slot, a):
                return  # a stop string in the text not yet sent ended it first
            tail = a.detok.flush()
            out, stopped = a.stopper.push(tail) if tail else ("", False)
            out += "" if stopped else a.stopper.flush()
            if out:
                self._emit(a.handle, Token(out))
            if stopped:
                reason = "stop"
        now = time.monotonic()
        t_first = a.t_first or now
        usage = Usage(prompt_tokens=a.prompt_len, completion_tokens=a.n_gen, cached_tokens=a.cached,
                      prompt_ms=round((t_first - a.t_start) * 1000, 3), predicted_ms=round((now - t_first) * 1000, 3),
                      queue_ms=round((a.t_start - (a.handle.t_enqueued or a.t_start)) * 1000, 3))
        self.stats.prompt_seconds_total += t_first - a.t_start
        self.stats.predicted_seconds_total += now - t_first
        self.stats.requests_finished_total += 1
        self._emit(a.handle, Done(reason, usage, gen.tag))
        self._release(gen, slot)

    def _fault(self, stage: str, faulty: frozenset[str]) -> None:
        if stage in faulty:
            raise faults.InjectedFault(f"injected fault at stage {stage}")

    def _request_failed(self, gen: Generation, handle: RequestHandle, stage: str, exc: Exception,
                        slot: Slot | None = None) -> None:
        """An exception while serving one request ends that request with a JSON error (500,
        ``request_failed``, never retried elsewhere: the same request would fail there too) and
        frees its slot; the engine thread and every other request go on."""
        log_event(log, logging.ERROR, "request failed", req=handle.id, stage=stage, error=repr(exc), exc_info=True)
        self.stats.requests_failed_total += 1
        self._emit(handle, Failed(f"the request failed while {stage}: {type(exc).__name__}: {exc}",
                                  status=500, code="request_failed"))
        if slot is None:  # failed while admitting: the slot may already have taken it
            slot = next((sl for sl in gen.slots if sl.active is not None and sl.active.handle is handle), None)
        if slot is not None and slot.active is not None and slot.active.handle is handle:
            try:
                self._release(gen, slot)
            except Exception as again:  # freeing its sampler failed too: drop the slot's bookkeeping anyway
                log_event(log, logging.ERROR, "slot release failed", slot=slot.id, error=repr(again))
                slot.active = None
                gen.n_active -= 1

    def _release(self, gen: Generation, slot: Slot) -> None:
        a = slot.active
        if a is None:
            return
        a.sampler.free()
        slot.active = None
        slot.last_used = time.monotonic()
        gen.n_active -= 1

    def _decode_failed(self, gen: Generation, rc: int, before: list[tuple[Slot, int]]) -> None:
        """Undo this step's tokens; fail the affected requests with a clear reason."""
        for slot, n in before:
            gen.ctx.seq_rm(slot.id, n, -1)
            del slot.cache[n:]
        msg = ("the context is full (all slots together exceed n_ctx)" if rc == 1
               else f"llama_decode failed with code {rc}")
        log_event(log, logging.ERROR, "decode failed", rc=rc, slots=len(before))
        seen: set[int] = set()
        for slot, _ in before:
            if slot.id in seen or slot.active is None:
                continue
            seen.add(slot.id)
            self._emit(slot.active.handle, Failed(msg, status=503 if rc == 1 else 500,
                                                  code="context_full" if rc == 1 else "decode_error"))
            self._release(gen, slot)

    def _cancel(self, handle: RequestHandle) -> None:
        try:
            self._waiting.remove(handle)
            return
        except ValueError:
            pass
        for gen in ([self.gen] if self.gen else []) + self.retiring:
            for slot in gen.slots:
                if slot.active is not None and slot.active.handle is handle:
                    self.stats.requests_cancelled_total += 1
                    self._release(gen, slot)
                    return

    def _fail_all(self, message: str, engine_failed: bool, status: int = 500, code: str = "engine_error") -> None:
        self._settle_text()  # what was generated before the failure still reaches the client
        while self._waiting:
            self._emit(self._waiting.popleft(), Failed(message, engine_failed, status, code))
        for gen in ([self.gen] if self.gen else []) + self.retiring:
            for slot in gen.slots:
                if slot.active is not None:
                    self._emit(slot.active.handle, Failed(message, engine_failed, status, code))
                    self._release(gen, slot)
        if self._pending_swap is not None:
            self._pending_swap[2].set_exception(RuntimeError(message))
            self._pending_swap = None

    def _shutdown_gen(self) -> None:
        self.state_buffers.clear()
        gen, self.gen = self.gen, None
        for g in ([gen] if gen else []) + self.retiring:
            g.free()
        self.retiring.clear()
        if self._drain is not None:
            self._drain[1].set()
            self._drain = None

    def _emit(self, handle: RequestHandle, ev: Any) -> None:
        self._out.append((handle, ev))

    def _flush(self) -> None:
        if self._out and self._loop is not None:
            out, self._out = self._out, []
            try:
                self._loop.call_soon_threadsafe(self._deliver, out)
            except RuntimeError:
                pass

    # ----- read-only views (any thread) --------------------------------------------------

    def slots_view(self) -> dict[str, int]:
        gen = self.gen
        retiring = sum(g.n_active for g in self.retiring)
        if gen is None:
            return {"busy": retiring, "total": 0, "queued": len(self._waiting)}
        return {"busy": gen.n_active + retiring, "total": len(gen.slots), "queued": len(self._waiting)}


def sibling_problem(old: Generation, new: Generation) -> str | None:
    """Two quants of one model share architecture and KV layout; only then can KV move between them."""
    a, b = old.identity(), new.identity()
    for key in ("arch", "n_layer", "n_embd", "n_head_kv", "n_vocab"):
        if a[key] != b[key]:
            return (f"'{new.resolved.id}' is not a sibling quant of '{old.resolved.id}': {key} {b[key]!r} != {a[key]!r}; "
                    "the current model keeps serving")
    if (old.params.cache_type_k, old.params.cache_type_v) != (new.params.cache_type_k, new.params.cache_type_v):
        return "KV cache types differ between the two generations; the current model keeps serving"
    return None


def carry_slots(old: Generation, new: Generation) -> dict[str, int]:
    """Move every idle slot's KV from one generation to a sibling one (same KV layout); slots that
    cannot move start empty in the new generation and are counted as dropped."""
    carried = dropped = 0
    for slot in old.slots:
        if not slot.cache or slot.active is not None:
            continue
        if slot.id >= len(new.slots) or len(slot.cache) >= new.ctx.n_ctx_seq:
            dropped += 1
            continue
        try:
            data = old.read_state(slot)
            new.write_state(new.slots[slot.id], list(slot.cache), data, foreign=slot.foreign)
            new.slots[slot.id].last_used = slot.last_used
            carried += 1
        except RuntimeError as exc:
            log_event(log, logging.WARNING, "slot KV not carried", slot=slot.id, error=str(exc))
            dropped += 1
    return {"carried": carried, "dropped": dropped}


class StateError(Exception):
    """A state request that cannot be served; ``kind`` maps to a protocol status."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # not_found | conflict | incompatible | failed


class PromptTooLong(ValueError):
    """A prompt refused by its length before tokenizing (400 ``context_length_exceeded``)."""


class _RequestError(Exception):
    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

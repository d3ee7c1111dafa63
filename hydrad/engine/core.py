"""The engine core: one thread owns llama.cpp and runs continuous batching over all slots.

Async code never touches llama.cpp. It sends commands on a queue; the engine thread admits
requests into free slots between steps, puts every active sequence into one ``llama_decode``
per step, samples in llama.cpp's sampler chains, and hands the step's events back to the
event loop in one ``call_soon_threadsafe`` (not one wake-up per token). Model loads run on a
loader thread so the current generation keeps serving while the next one is built.

``EngineCore`` is the only writer of its state. Other code sends typed commands
(``hydrad.engine.commands``) or calls its methods, and reads :meth:`EngineCore.snapshot`.
This module holds the thread loop and the command dispatch; the parts live beside it:
``loading`` (the loader thread), ``batching`` (admit, step, sample, text, finish),
``kvops`` (KV state get/put and carry), ``snapshot`` (what the views render).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Coroutine

from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread
from hydrad.common.params import RuntimeParams
from hydrad.engine import faults
from hydrad.engine.batching import MAX_CHARS_PER_TOKEN, PRETOKENIZE_CHARS, Batching, PromptTooLong, RequestRefused, _Active
from hydrad.engine.commands import (
    Abandon, Cancel, Command, Drain, Embed, Install, Rebuild, Resume, SetDefaults, StateErase, StateGet, StatePut,
    Stop, Submit, SubmitBurst, Swap, SwitchStandby, Unload,
)
from hydrad.engine.embedjobs import EmbedJobs
from hydrad.engine.generation import Generation, Slot
from hydrad.engine.kvops import KvOps, StateError, carry_slots, sibling_problem
from hydrad.engine.loader import LoadRecord
from hydrad.engine.loading import EngineBusy, Loading
from hydrad.engine.requests import Failed, RequestHandle
from hydrad.engine.pairing import Pairing
from hydrad.engine.prefixshare import PrefixShare
from hydrad.engine.reaper import Reaper
from hydrad.engine.settings import PrefixSettings, ReaperSettings
from hydrad.engine.peer_watch import PeerWatch
from hydrad.engine.snapshot import EngineSnapshot, ModelSummary, slot_rows
from hydrad.engine.statebuf import StateBuffers
from hydrad.engine.stats import EngineStats
from hydrad.wire.requests import GenRequest

log = logging.getLogger("hydrad.engine")

__all__ = ["EngineCore", "EngineBusy", "PromptTooLong", "RequestRefused", "StateError", "EngineSnapshot", "LoadRecord",
           "MAX_CHARS_PER_TOKEN", "PRETOKENIZE_CHARS", "sibling_problem", "carry_slots"]


HAND_OVER_PASSES = 4  # event-loop passes a burst's submissions may gather in before the engine gets them


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop``'s thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class SlotsBusy(RuntimeError):
    """An expert-mode switch asked for while requests decode (it is refused, not queued)."""


class EngineCore(Loading, Batching, KvOps, EmbedJobs):
    def __init__(self, on_status: Callable[[EngineSnapshot], None] | None = None, max_queue: int = 64,
                 drain_timeout_s: float = 30.0, device: str | None = None, prefix: PrefixSettings | None = None,
                 slow_turn_ms: float = 0.0, reaper: ReaperSettings | None = None, load_threads: int = 1) -> None:
        self.stats = EngineStats()
        self.slow_turn_s = slow_turn_ms / 1000  # a turn of the loop longer than this is logged with its parts (0: off)
        self.prefix = PrefixShare(prefix or PrefixSettings())
        self.pairing = Pairing()  # the COMBINE role (head, peer), read by every view
        self.stage = "starting"
        self.progress: float | None = None
        self.params: RuntimeParams | None = None  # T1 defaults in force
        self.gen: Generation | None = None  # serves new requests
        self.retiring: list[Generation] = []  # older generations finishing their in-flight requests (overlap)
        pace = reaper or ReaperSettings()
        self.reaper = Reaper(pace.delay_ms / 1000, pace.pause_ms / 1000)  # frees retired generations off this thread
        self.standby: Generation | None = None  # the other expert placement, resident for a fast mode switch
        self.load_threads = load_threads  # CPU threads a load beside a serving generation takes from it
        self.loads: dict[int, LoadRecord] = {}
        self.current_load: LoadRecord | None = None
        self.last_error: str | None = None
        self.admitting = True
        self.max_queue = max_queue
        self.device = device
        self.heartbeat = time.monotonic()
        self._on_status = on_status
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._arrivals: list[RequestHandle] = []  # submitted in this pass of the event loop (submit)
        self._waiting: deque[RequestHandle] = deque()
        self._embeds: deque[Any] = deque()  # embedding requests (embedjobs), computed between steps
        self._out: list[tuple[RequestHandle, Any]] = []
        self.state_buffers = StateBuffers()  # KV state snapshots and uploads; any thread may take one
        self._deferred: list[tuple[Generation, Slot, _Active]] = []  # text to make while the device computes
        self._unsynced: set[Generation] = set()  # steps queued on the device and not waited for (batching._step)
        self._pending_swap: Swap | None = None
        self._drain: tuple[float, Drain] | None = None  # drain-policy reload in progress: (deadline, command)
        self.drain_timeout_s = drain_timeout_s
        self._thread: threading.Thread | None = None
        self._running = False  # the engine thread's loop runs (set by start, cleared as the thread ends)
        self._load_ids = 0
        self._lock = threading.Lock()  # guards stage/current_load between loader and loop threads
        self._snap_lock = threading.Lock()  # one snapshot builder at a time
        self._snap = EngineSnapshot(max_queue=max_queue, device=device, stats=self.stats)
        self._faults = faults.armed()  # False outside fault-injection tests
        self.abandoned: list[Generation] = []  # set aside when a COMBINE peer died; never freed (see Abandon)
        self.on_peer_lost: Callable[[str], None] | None = None  # the control layer's fallback (a SOLO reload)

    # ----- event-loop side -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hydrad-engine", daemon=True)
        self._running = True
        self._thread.start()
        self._set_stage("idle")

    def on_loop(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` on the event loop, from any thread (closed and dropped when the loop is gone)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, loop)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def submit(self, request: GenRequest) -> RequestHandle:
        """Queue a request for the engine thread. On the event loop, the requests submitted in one pass
        of the loop go over together, from a callback queued after the tasks already ready: the loop
        parses one request at a time, and the engine thread, woken by the first of a burst, would start
        a step with it alone while the others wait that whole step (on the GPU host a 3B model's 8-prompt
        burst waited 23 ms median from arrival to slot). A lone request waits two passes of the loop."""
        handle = RequestHandle(request)
        loop = self._loop
        if loop is None or not _on(loop):
            self._cmds.put(Submit(handle))
            return handle
        self._arrivals.append(handle)
        if len(self._arrivals) == 1:
            loop.call_soon(self._hand_over, 1, 1)
        return handle

    def _hand_over(self, hops: int, seen: int) -> None:
        """Queue the arrivals once a pass of the loop (which polls the sockets) brought no more, after at
        least two passes (the first may run before the poll that finds the rest of a burst) and at most
        HAND_OVER_PASSES."""
        n = len(self._arrivals)
        if hops < HAND_OVER_PASSES and (hops < 2 or n > seen):
            self._loop.call_soon(self._hand_over, hops + 1, n)  # type: ignore[union-attr]  # set: submit used it
            return
        arrivals, self._arrivals = self._arrivals, []
        if arrivals:
            self._cmds.put(Submit(arrivals[0]) if len(arrivals) == 1 else SubmitBurst(tuple(arrivals)))

    def cancel(self, handle: RequestHandle) -> None:
        if handle in self._arrivals:  # not handed over yet: it never reaches the engine
            self._arrivals.remove(handle)
            handle.finished = True
            return
        if not handle.finished:
            self._cmds.put(Cancel(handle))

    def set_defaults(self, params: RuntimeParams) -> None:
        """T1: per-request defaults change at once; nothing is rebuilt."""
        if self._thread is None:  # not started: nothing reads them concurrently yet
            self.params = params
            self._publish()
            return
        self._cmds.put(SetDefaults(params))

    async def rebuild_context(self, params: RuntimeParams) -> dict[str, Any]:
        """T2: rebuild the context (in-flight requests finish first), carrying slots' KV where it fits.
        Returns seconds taken and how many slots were carried or dropped."""
        if self.gen is None:
            self.set_defaults(params)
            return {"seconds": 0.0, "carried": 0, "dropped": 0}
        with self._lock:
            if self.current_load is not None or self._pending_swap is not None:
                raise EngineBusy("a model load or context rebuild is under way; try again when it ends")
        cmd = Rebuild(params)
        self._cmds.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    async def unload(self) -> None:
        cmd = Unload()
        self._cmds.put(cmd)
        await asyncio.wrap_future(cmd.fut)

    def stop_admitting(self) -> None:
        """Shutdown begins: new requests are refused and the stage says ``stopping``."""
        self.admitting = False
        self._set_stage("stopping")

    def record_error(self, message: str | None) -> None:
        """The error views report as ``last_error`` (None clears it)."""
        self.last_error = message
        self._publish()

    def stop(self) -> None:
        """Ask the engine thread to end remaining requests, free llama.cpp and exit."""
        self.admitting = False
        self._publish()
        self._cmds.put(Stop())

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_stage(self, stage: str, progress: float | None = None) -> None:
        changed = stage != self.stage
        self.stage = stage
        self.progress = progress
        if changed:
            log_event(log, logging.INFO, "stage", stage=stage)
        snap = self._publish()
        if self._on_status is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_status, snap)
            except RuntimeError:  # loop closed during shutdown
                pass

    def _deliver(self, batch: list[tuple[RequestHandle, Any]]) -> None:
        for handle, ev in batch:
            handle.queue.put_nowait(ev)

    # ----- the snapshot (built by the thread that changed something; read by anyone) -------

    def _publish(self) -> EngineSnapshot:
        """Rebuild the snapshot from the state now. Called after every change a view shows."""
        with self._snap_lock:
            gen, rec = self.gen, self.current_load
            busy, total, queued = self._counts()
            self._snap = snap = EngineSnapshot(
                stage=self.stage, progress=self.progress, alive=self._running, admitting=self.admitting,
                model=ModelSummary.of(gen) if gen is not None else None,
                load_id=rec.id if rec is not None else None, loading_model=rec.model if rec is not None else None,
                last_error=self.last_error, slots_busy=busy, slots_total=total, queued=queued,
                max_queue=self.max_queue, params=self.params or (gen.params if gen is not None else None),
                device=self.device, stats=self.stats,
                standby=self._standby_view())
        return snap

    def _standby_view(self) -> dict[str, Any] | None:
        sb = self.standby
        if sb is None:
            return None
        return {"generation": sb.tag.fingerprint, "mode": "combine" if sb.placement and sb.placement.peers else "solo",
                "placement": sb.placement.public() if sb.placement is not None else None}

    def snapshot(self) -> EngineSnapshot:
        """The engine as the views show it; the busy/queued counts are read live."""
        snap = self._snap
        busy, total, queued = self._counts()
        alive = snap.alive and self.alive
        if (busy, queued, alive) != (snap.slots_busy, snap.queued, snap.alive):
            snap = dataclasses.replace(snap, slots_busy=busy, queued=queued, alive=alive)
        return snap

    def _counts(self) -> tuple[int, int, int]:
        gen = self.gen
        busy = sum(g.n_active for g in list(self.retiring))
        if gen is None:
            return busy, 0, len(self._waiting)
        return busy + gen.n_active, len(gen.slots), len(self._waiting)

    def slots_view(self) -> dict[str, int]:
        busy, total, queued = self._counts()
        return {"busy": busy, "total": total, "queued": queued}

    def slot_rows(self) -> list[dict[str, Any]]:
        """Every slot of the serving generation as it is now (``/slots``, INFO)."""
        return slot_rows(self.gen, time.monotonic())

    # ----- engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread()
        try:
            self._turns()
        except BaseException as exc:  # the engine is dead: every caller must hear it, not hang
            log.exception("engine thread died")
            self.last_error = f"engine thread died: {exc}"
            self._fail_all(f"engine failed: {exc}", engine_failed=True)
            self._fail_embeds(f"engine failed: {exc}", status=500, code="engine_failed")
            self._flush()
            raise
        finally:
            self._shutdown_gen()
            self._running = False
            self._publish()

    def _turns(self) -> None:
        """The engine thread's loop, until a Stop command. With ``logging.slow_turn_ms`` a turn longer than
        that is logged with where its time went (a few clock reads a turn: nothing beside a step)."""
        clock, slow = time.perf_counter, self.slow_turn_s
        while True:
            idle = not self._busy()
            t0 = clock()
            if not self._drain_commands(block=idle):
                return
            t_cmd = clock()
            if idle:  # an idle engine's wait for a command is not part of a turn
                t0 = t_cmd
            if self._unsynced and not self._only_steps():
                self.settle_device()
            self.heartbeat = time.monotonic()
            self._maybe_swap()
            self._share_cpu()
            self._drain_step()
            self._expire_waiting()
            self._admit()
            self._embed_step()
            t_admit = clock()
            steps: list[tuple[Generation, float]] | None = [] if slow else None
            for old in [g for g in self.retiring if g.n_active]:
                self._timed_step(old, steps)
            if self.gen is not None and self.gen.n_active:
                self._timed_step(self.gen, steps)
            t_steps = clock()
            self._retire_idle()
            self.state_buffers.trim()
            self._flush()
            if steps is not None:
                self._log_slow_turn(slow, t0, t_cmd, t_admit, steps, t_steps, clock())

    def _share_cpu(self) -> None:
        """While a model loads (or warms up) beside the generations that serve, their contexts compute
        with ``load_threads`` fewer CPU threads; otherwise with their own. Checked every turn, so no
        way out of a load (done, failed, aborted) can leave a context short."""
        rec = self.current_load
        beside = self.load_threads if rec is not None and rec.phase in ("loading", "warming") else 0
        for g in (self.gen, *self.retiring):
            if g is not None:
                g.ctx.share_cpu(beside)
                if g.embedder is not None:  # embedding requests are computed between steps, on its own context
                    g.embedder.ctx.share_cpu(beside)

    def _timed_step(self, gen: Generation, into: list[tuple[Generation, float]] | None) -> None:
        """One step of ``gen``; with the slow-turn log on, its duration goes ``into`` the turn's list."""
        if into is None:
            self._step(gen)
            return
        t0 = time.perf_counter()
        self._step(gen)
        into.append((gen, time.perf_counter() - t0))

    @staticmethod
    def _log_slow_turn(slow: float, t0: float, t_cmd: float, t_admit: float, steps: list[tuple[Generation, float]],
                       t_steps: float, t_end: float) -> None:
        if t_end - t0 <= slow:
            return

        def ms(seconds: float) -> float:
            return round(seconds * 1000, 1)

        log_event(log, logging.INFO, "slow engine turn", ms=ms(t_end - t0), commands_ms=ms(t_cmd - t0),
                  admit_ms=ms(t_admit - t_cmd), after_ms=ms(t_end - t_steps),
                  steps=",".join(f"{g.tag.fingerprint}:{ms(d)}" for g, d in steps) or "-")

    def _only_steps(self) -> bool:
        """Whether this turn of the loop can do nothing but step: no request, embedding, swap, drain or
        retiring generation waits (commands settle the device themselves, _drain_commands). Only then may
        a step still be computing (see settle_device)."""
        return (not self._waiting and not self._embeds and self._pending_swap is None and self._drain is None
                and not self.retiring)

    def _enqueue(self, handle: RequestHandle) -> None:
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

    def _busy(self) -> bool:
        gen = self.gen
        if any(g.n_active for g in self.retiring) or self._embeds:
            return True
        if gen is None:
            return False
        return bool(gen.n_active or (self._waiting and gen.free_slot_exists() and not self._pending()))

    def _pending(self) -> bool:
        return self._pending_swap is not None or self._drain is not None

    def _draining(self) -> bool:
        return self._drain is not None

    def _retire_idle(self) -> None:
        for old in [g for g in self.retiring if not g.n_active]:
            self.retiring.remove(old)
            self._bury(old, "its last request ended")

    def _bury(self, gen: Generation, why: str) -> None:
        """Hand a generation no slot uses any more to the reaper (freed on its thread, not this one)."""
        if gen in self._unsynced:  # its last step may still compute: done before anyone frees it
            self._unsynced.discard(gen)
            gen.ctx.synchronize()
        self.reaper.bury(gen, gen.tag.fingerprint, why, gen.model.info.size_bytes)

    def _drain_step(self) -> None:
        """Drain policy: once in-flight requests are done (or the bound passed), free the generation."""
        if self._drain is None:
            return
        deadline, cmd = self._drain
        gen = self.gen
        if gen is not None and gen.n_active and time.monotonic() < deadline and not cmd.rec.abort.is_set():
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
            self._publish()
        self._drain = None
        cmd.done.set()

    def _drain_commands(self, block: bool) -> bool:
        try:
            cmd = self._cmds.get(timeout=0.25) if block else self._cmds.get_nowait()
        except queue.Empty:
            return True
        self.settle_device()  # a command may read or change what a queued step computes
        while True:
            if not self._handle(cmd):
                return False
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, cmd: Command) -> bool:
        """One command, on the engine thread; False ends the loop."""
        match cmd:
            case Submit(handle=handle):
                self._enqueue(handle)
            case SubmitBurst(handles=handles):
                for handle in handles:
                    self._enqueue(handle)
            case Cancel(handle=handle):
                self._cancel(handle)
            case SetDefaults(params=params):
                self.params = params
                self._publish()
            case StateGet():
                self._state_get(cmd)
            case StatePut():
                self._state_put(cmd)  # cmd.trusted: untrusted KV marks the slot foreign
            case StateErase():
                self._state_erase(cmd)
            case Embed():
                self._queue_embed(cmd)
            case Rebuild() | Install() | Unload():
                self._pending_swap = cmd
            case Drain():
                self._drain = (time.monotonic() + self.drain_timeout_s, cmd)
            case Abandon(gen_id=gen_id, reason=reason):
                self._abandon(gen_id, reason)
            case SwitchStandby(fut=fut):
                self._switch_standby(fut)
            case Resume():
                pass  # wakes the loop so queued requests are re-examined
            case Stop():
                self._fail_all("engine is shutting down", engine_failed=True, status=503, code="shutting_down")
                self._fail_embeds("engine is shutting down")
                self._flush()
                return False
            case _:
                raise TypeError(f"not an engine command: {cmd!r}")
        return True

    def _maybe_swap(self) -> None:
        """Apply a pending install/rebuild/unload. An overlap install takes over at once (the old generation
        retires when its in-flight requests end); the others wait until no slot is active."""
        cmd = self._pending_swap
        if cmd is None:
            return
        overlap = isinstance(cmd, Install) and not cmd.rec.carry_kv
        if not overlap and self.gen is not None and self.gen.n_active:
            return
        self._pending_swap = None
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
                self.params = new.params
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
                        self._bury(old, "replaced while idle")
                # done from the moment the model serves: a client that sees /health turn 200 and then asks
                # /control/loads/{id} must not find the load still "installing" (the loader thread writes
                # the rest of the record when it wakes)
                rec.phase, rec.progress = "done", 1.0
                if rec.run_t0 is not None:
                    rec.seconds = round(time.monotonic() - rec.run_t0, 3)
                self._publish()
            elif isinstance(cmd, Rebuild):
                t0 = time.monotonic()
                assert self.gen is not None
                if self.standby is not None:  # its context no longer matches the parameters in force
                    self.standby.free()
                    self.standby = None
                carried = self.gen.rebuild_context(cmd.params)
                self.params = cmd.params
                result = {"seconds": time.monotonic() - t0, **carried}
                self.stats.context_rebuilds_total += 1
                self._publish()
            else:
                self._shutdown_gen()
                self._set_stage("idle")
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
            self._cmds.put(Abandon(gen.id, message))
            if self.on_peer_lost is not None:
                self.on_peer_lost(message)

        gen.watch = PeerWatch([p.endpoint for p in peers], lost)
        gen.watch.start()

    def _abandon(self, gen_id: int, reason: str) -> None:
        if self.standby is not None and self.standby.id == gen_id:
            self.standby.abandoned = True
            self.abandoned.append(self.standby)
            self.standby = None
            self.stats.peer_losses_total += 1
            log_event(log, logging.WARNING, "standby generation set aside: its COMBINE peer is gone", generation=gen_id,
                      reason=reason)
            self._publish()
            return
        for gen in ([self.gen] if self.gen else []) + self.retiring:
            if gen.id != gen_id:
                continue
            self._settle_text()
            for slot in gen.slots:
                if slot.active is not None:
                    self._emit(slot.active.handle, Failed(reason, status=503, code="peer_lost"))
                    self._release(gen, slot)
            gen.abandoned = True
            if gen is self.gen:  # the resident other placement (SOLO, say) takes over at once, if there is one
                self.gen, self.standby = self.standby, None
                if self.gen is not None:
                    self.params = self.gen.params
                self.state_buffers.clear()
            else:
                self.retiring.remove(gen)
            self.abandoned.append(gen)
            self.stats.peer_losses_total += 1
            self.last_error = reason
            log_event(log, logging.ERROR, "generation set aside: its COMBINE peer is gone", generation=gen.id,
                      model=gen.resolved.id, reason=reason)
            if self.gen is None and self.current_load is None:
                self._set_stage("idle")
            self._publish()
            return

    def _switch_standby(self, fut: Any) -> None:
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
        self.params = standby.params
        self.state_buffers.clear()
        self._publish()
        fut.set_result(standby.params)

    async def switch_standby(self) -> RuntimeParams:
        """Make the standby serve (see SwitchStandby); returns the parameters it serves with."""
        cmd = SwitchStandby()
        self._cmds.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    def _shutdown_gen(self) -> None:
        with contextlib.suppress(Exception):
            self.settle_device()
        self.state_buffers.clear()
        gen, self.gen = self.gen, None
        standby, self.standby = self.standby, None
        for g in ([gen] if gen else []) + ([standby] if standby else []) + self.retiring:
            g.free()
        self.retiring.clear()
        if not self.reaper.wait(60):
            log_event(log, logging.WARNING, "a retired generation is still being freed at shutdown")
        if self._drain is not None:
            self._drain[1].done.set()
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

"""The engine core: one thread owns llama.cpp and runs continuous batching over all slots.

Async code never touches llama.cpp. It sends commands on a queue; the engine thread admits
requests into free slots between steps, puts every active sequence into one ``llama_decode``
per step, samples in llama.cpp's sampler chains, and hands the step's events back to the
event loop in one ``call_soon_threadsafe`` (not one wake-up per token). Model loads run on a
loader thread so the current generation keeps serving while the next one is built.

``EngineCore`` is the engine's one interface and runs the thread's loop and the command dispatch;
each piece of state has one owner among its components:

- :class:`~hydrad.engine.promptprep.PromptPrep` prepares requests off the engine thread (owns nothing);
- :class:`~hydrad.engine.batching.Scheduler` owns the requests (wait queue, each slot's request);
- :class:`~hydrad.engine.loading.Loader` owns the model (the generations and the load records);
- :class:`~hydrad.engine.kvops.KvMover` moves slots' KV in and out (owns the state buffers);
- :class:`~hydrad.engine.embedjobs.EmbedRunner` owns the embedding requests.

The core itself owns the stage, the defaults in force (``params``) and the frozen snapshot
(:meth:`snapshot`), the one status every view reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Coroutine

from hydrad.common.logs import log_event
from hydrad.common.osthread import name_os_thread
from hydrad.common.params import RuntimeParams
from hydrad.engine import faults
from hydrad.engine.batching import Scheduler
from hydrad.engine.commands import (
    Abandon, Cancel, Command, Drain, Embed, Install, Rebuild, Resume, SetDefaults, StateErase, StateGet, StatePut,
    Stop, Submit, SubmitBurst, SwitchStandby, Unload,
)
from hydrad.engine.embedjobs import EmbedRunner
from hydrad.engine.generation import Generation
from hydrad.engine.kvops import KvMover, StateError, carry_slots, sibling_problem
from hydrad.engine.loader import LoadRecord
from hydrad.engine.loading import EngineBusy, Loader, SlotsBusy
from hydrad.engine.pairing import Pairing
from hydrad.engine.prefixshare import PrefixShare
from hydrad.engine.promptprep import MAX_CHARS_PER_TOKEN, PRETOKENIZE_CHARS, PromptPrep, PromptTooLong, RequestRefused
from hydrad.engine.reaper import Reaper
from hydrad.engine.requests import RequestHandle
from hydrad.engine.settings import PrefixSettings, ReaperSettings
from hydrad.engine.snapshot import EngineSnapshot, ModelSummary, slot_rows
from hydrad.engine.stats import EngineStats
from hydrad.wire.requests import GenRequest

log = logging.getLogger("hydrad.engine")

__all__ = ["EngineCore", "EngineBusy", "PromptTooLong", "RequestRefused", "SlotsBusy", "StateError", "EngineSnapshot",
           "LoadRecord", "MAX_CHARS_PER_TOKEN", "PRETOKENIZE_CHARS", "sibling_problem", "carry_slots"]


HAND_OVER_PASSES = 4  # event-loop passes a burst's submissions may gather in before the engine gets them


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop``'s thread."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class EngineCore:
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
        pace = reaper or ReaperSettings()
        self.prep = PromptPrep(self)
        self.scheduler = Scheduler(self)
        self.loader = Loader(self, Reaper(pace.delay_ms / 1000, pace.pause_ms / 1000), load_threads, drain_timeout_s)
        self.kv = KvMover(self)
        self.embeds = EmbedRunner(self)
        self.last_error: str | None = None
        self.admitting = True
        self.max_queue = max_queue
        self.device = device
        self.heartbeat = time.monotonic()
        self.faults_armed = faults.armed()  # False outside fault-injection tests
        self.on_peer_lost: Callable[[str], None] | None = None  # the control layer's fallback (a SOLO reload)
        self.asleep: str | None = None  # the model freed by the idle sleep, loaded again by the next request
        self.on_wake: Callable[[], None] | None = None  # the control layer's wake-up (starts that load)
        self.t_last_request = 0.0  # monotonic time of the last request submitted (the idle sleep's clock)
        self._on_status = on_status
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._arrivals: list[RequestHandle] = []  # submitted in this pass of the event loop (submit)
        self._out: list[tuple[RequestHandle, Any]] = []
        self._thread: threading.Thread | None = None
        self._running = False  # the engine thread's loop runs (set by start, cleared as the thread ends)
        self._snap_lock = threading.Lock()  # one snapshot builder at a time
        self._snap = EngineSnapshot(max_queue=max_queue, device=device, stats=self.stats)

    # ----- what the components own, read here ----------------------------------------------

    @property
    def gen(self) -> Generation | None:
        """The generation serving new requests (the loader's)."""
        return self.loader.gen

    @property
    def retiring(self) -> list[Generation]:
        return self.loader.retiring

    @property
    def standby(self) -> Generation | None:
        return self.loader.standby

    @property
    def current_load(self) -> LoadRecord | None:
        return self.loader.current_load

    @property
    def loads(self) -> dict[int, LoadRecord]:
        return self.loader.loads

    @property
    def state_buffers(self) -> Any:
        return self.kv.buffers

    # ----- event-loop side -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hydrad-engine", daemon=True)
        self._running = True
        self._thread.start()
        self.set_stage("idle")

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
        return len(self.scheduler.waiting)

    def submit(self, request: GenRequest) -> RequestHandle:
        """Queue a request for the engine thread. On the event loop, the requests submitted in one pass
        of the loop go over together, from a callback queued after the tasks already ready: the loop
        parses one request at a time, and the engine thread, woken by the first of a burst, would start
        a step with it alone while the others wait that whole step (on the GPU host a 3B model's 8-prompt
        burst waited 23 ms median from arrival to slot). A lone request waits two passes of the loop."""
        handle = RequestHandle(request)
        self.t_last_request = time.monotonic()
        if self.asleep is not None and self.on_wake is not None:
            self.on_wake()  # the model the engine slept with is loaded again; the request waits for it
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
            self.publish()
            return
        self._cmds.put(SetDefaults(params))

    def put(self, cmd: Command) -> None:
        """Queue a command for the engine thread (any thread)."""
        self._cmds.put(cmd)

    async def prepare(self, request: GenRequest) -> None:
        """See :meth:`hydrad.engine.promptprep.PromptPrep.prepare`."""
        if self.faults_armed and faults.STALL in faults.stages_of(request):
            faults.hold_loop()  # a test's stall of the main loop (hydrad.engine.faults)
        await self.prep.prepare(request)

    def load(self, *args: Any, **kwargs: Any) -> LoadRecord:
        """T3: load a model (see :meth:`hydrad.engine.loading.Loader.load`)."""
        return self.loader.load(*args, **kwargs)

    def use_fetcher(self, fetcher: Any) -> None:
        """At start: loads of a model the disk lacks fetch it with ``fetcher`` (``hydrad.engine.fetch``) first."""
        self.loader.fetcher = fetcher

    async def warm_estimate(self, resolved: Any, params: RuntimeParams, kv_bytes_per_token: int | None) -> None:
        """Off the event loop: what :meth:`load` estimates, read ahead (see ``Loader.warm_estimate``)."""
        await asyncio.to_thread(self.loader.warm_estimate, resolved, params, kv_bytes_per_token)

    async def abort_load(self) -> None:
        await self.loader.abort_load()

    async def rebuild_context(self, params: RuntimeParams) -> dict[str, Any]:
        """T2: rebuild the context (in-flight requests finish first), carrying slots' KV where it fits.
        Returns seconds taken and how many slots were carried or dropped."""
        if self.gen is None:
            self.set_defaults(params)
            return {"seconds": 0.0, "carried": 0, "dropped": 0}
        if self.loader.busy():
            raise EngineBusy("a model load or context rebuild is under way; try again when it ends")
        cmd = Rebuild(params)
        self._cmds.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    async def unload(self) -> None:
        cmd = Unload()
        self._cmds.put(cmd)
        await asyncio.wrap_future(cmd.fut)

    async def switch_standby(self) -> RuntimeParams:
        """Make the standby serve (see SwitchStandby); returns the parameters it serves with."""
        cmd = SwitchStandby()
        self._cmds.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    async def state_get(self, slot_id: int) -> tuple[dict[str, Any], Any]:
        return await self.kv.state_get(slot_id)

    async def state_put(self, slot_id: int, meta: dict[str, Any], data: Any, trusted: bool = False) -> dict[str, Any]:
        return await self.kv.state_put(slot_id, meta, data, trusted)

    async def state_erase(self, slot_id: int) -> int:
        return await self.kv.state_erase(slot_id)

    def check_put(self, slot_id: int, meta: Any, max_bytes: int) -> StateError | None:
        return self.kv.check_put(slot_id, meta, max_bytes)

    async def embed(self, gen_id: int, inputs: list[list[int]]) -> list[Any]:
        self.t_last_request = time.monotonic()
        return await self.embeds.embed(gen_id, inputs)

    def stop_admitting(self) -> None:
        """Shutdown begins: new requests are refused and the stage says ``stopping``."""
        self.admitting = False
        self.set_stage("stopping")

    def record_error(self, message: str | None) -> None:
        """The error views report as ``last_error`` (None clears it)."""
        self.last_error = message
        self.publish()

    def stop(self) -> None:
        """Ask the engine thread to end remaining requests, free llama.cpp and exit."""
        self.admitting = False
        self.publish()
        self._cmds.put(Stop())

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def set_stage(self, stage: str, progress: float | None = None) -> None:
        changed = stage != self.stage
        self.stage = stage
        self.progress = progress
        if changed:
            log_event(log, logging.INFO, "stage", stage=stage)
        snap = self.publish()
        if self._on_status is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_status, snap)
            except RuntimeError:  # loop closed during shutdown
                pass

    def _deliver(self, batch: list[tuple[RequestHandle, Any]]) -> None:
        for handle, ev in batch:
            handle.queue.put_nowait(ev)

    # ----- the snapshot (built by the thread that changed something; read by anyone) -------

    def publish(self) -> EngineSnapshot:
        """Rebuild the snapshot from the state now. Called after every change a view shows."""
        with self._snap_lock:
            gen, rec = self.gen, self.loader.current_load
            busy, total, queued = self._counts()
            self._snap = snap = EngineSnapshot(
                stage=self.stage, progress=self.progress, alive=self._running, admitting=self.admitting,
                model=ModelSummary.of(gen) if gen is not None else None,
                load_id=rec.id if rec is not None else None, loading_model=rec.model if rec is not None else None,
                last_error=self.last_error, slots_busy=busy, slots_total=total, queued=queued,
                max_queue=self.max_queue, params=self.params or (gen.params if gen is not None else None),
                device=self.device, stats=self.stats,
                standby=self._standby_view(), asleep=self.asleep,
                fetch=dict(rec.fetch) if rec is not None and rec.fetch and rec.phase == "fetching" else None)
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
            return busy, 0, len(self.scheduler.waiting)
        return busy + gen.n_active, len(gen.slots), len(self.scheduler.waiting)

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
            self.fail_all(f"engine failed: {exc}", engine_failed=True)
            self.embeds.fail(f"engine failed: {exc}", status=500, code="engine_failed")
            self.flush()
            raise
        finally:
            self.loader.shutdown()
            self._running = False
            self.publish()

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
            if self.scheduler.unsynced and not self._only_steps():
                self.scheduler.settle_device()
            self.heartbeat = time.monotonic()
            self.loader.maybe_swap()
            self._share_cpu()
            self.loader.drain_step()
            self.scheduler.expire_waiting()
            self.scheduler.admit()
            self.embeds.step()
            t_admit = clock()
            steps: list[tuple[Generation, float]] | None = [] if slow else None
            for old in [g for g in self.retiring if g.n_active]:
                self._timed_step(old, steps)
            if self.gen is not None and self.gen.n_active:
                self._timed_step(self.gen, steps)
            t_steps = clock()
            self.loader.retire_idle()
            self.kv.buffers.trim()
            self.flush()
            if steps is not None:
                self._log_slow_turn(slow, t0, t_cmd, t_admit, steps, t_steps, clock())

    def _share_cpu(self) -> None:
        """While a model loads (or warms up) beside the generations that serve, their contexts compute
        with ``load_threads`` fewer CPU threads; otherwise with their own. Checked every turn, so no
        way out of a load (done, failed, aborted) can leave a context short."""
        rec = self.loader.current_load
        beside = self.loader.load_threads if rec is not None and rec.phase in ("loading", "warming") else 0
        for g in (self.gen, *self.retiring):
            if g is not None:
                g.ctx.share_cpu(beside)
                if g.embedder is not None:  # embedding requests are computed between steps, on its own context
                    g.embedder.ctx.share_cpu(beside)

    def _timed_step(self, gen: Generation, into: list[tuple[Generation, float]] | None) -> None:
        """One step of ``gen``; with the slow-turn log on, its duration goes ``into`` the turn's list."""
        if into is None:
            self.scheduler.step(gen)
            return
        t0 = time.perf_counter()
        self.scheduler.step(gen)
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
        a step still be computing (see Scheduler.settle_device)."""
        return (not self.scheduler.waiting and not self.embeds.jobs and self.loader.pending_swap is None
                and self.loader.drain is None and not self.retiring)

    def _busy(self) -> bool:
        gen = self.gen
        if any(g.n_active for g in self.retiring) or self.embeds.jobs:
            return True
        if gen is None:
            return False
        return bool(gen.n_active or (self.scheduler.waiting and gen.free_slot_exists() and not self.held()))

    def held(self) -> bool:
        """Whether admission waits for a swap or a drain."""
        return self.loader.pending_swap is not None or self.loader.drain is not None

    def draining(self) -> bool:
        return self.loader.drain is not None

    def _drain_commands(self, block: bool) -> bool:
        try:
            cmd = self._cmds.get(timeout=0.25) if block else self._cmds.get_nowait()
        except queue.Empty:
            return True
        self.scheduler.settle_device()  # a command may read or change what a queued step computes
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
                self.scheduler.enqueue(handle)
            case SubmitBurst(handles=handles):
                for handle in handles:
                    self.scheduler.enqueue(handle)
            case Cancel(handle=handle):
                self.scheduler.cancel(handle)
            case SetDefaults(params=params):
                self.params = params
                self.publish()
            case StateGet():
                self.kv.get(cmd)
            case StatePut():
                self.kv.put(cmd)  # cmd.trusted: untrusted KV marks the slot foreign
            case StateErase():
                self.kv.erase(cmd)
            case Embed():
                self.embeds.queue(cmd)
            case Rebuild() | Install() | Unload():
                self.loader.pending_swap = cmd
            case Drain():
                self.loader.drain = (time.monotonic() + self.loader.drain_timeout_s, cmd)
            case Abandon(gen_id=gen_id, reason=reason):
                self.loader.abandon(gen_id, reason)
            case SwitchStandby(fut=fut):
                self.loader.switch_standby(fut)
            case Resume():
                pass  # wakes the loop so queued requests are re-examined
            case Stop():
                self.fail_all("engine is shutting down", engine_failed=True, status=503, code="shutting_down")
                self.embeds.fail("engine is shutting down")
                self.flush()
                return False
            case _:
                raise TypeError(f"not an engine command: {cmd!r}")
        return True

    def fail_all(self, message: str, engine_failed: bool, status: int = 500, code: str = "engine_error") -> None:
        """Every request queued or running ends with this failure, and a swap waiting for them with it."""
        self.scheduler.fail_all(message, engine_failed, status, code)
        pending = self.loader.pending_swap
        if pending is not None:
            pending.fut.set_exception(RuntimeError(message))
            self.loader.pending_swap = None

    def emit(self, handle: RequestHandle, ev: Any) -> None:
        """Queue an event for a request; :meth:`flush` hands the queued ones to the loop."""
        self._out.append((handle, ev))

    def flush(self) -> None:
        if self._out and self._loop is not None:
            out, self._out = self._out, []
            try:
                self._loop.call_soon_threadsafe(self._deliver, out)
            except RuntimeError:
                pass

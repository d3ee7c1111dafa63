"""Where a session's KV goes between engines: moved off an engine that is leaving (a reload, a stop),
off one routing passed over, by hand (``hydractl migrate``), or brought back from the Store.

The front door decides where a turn runs; this module decides how the session's KV gets there first.
One move at a time per session: a session whose KV is being moved off a leaving engine when its next
turn arrives waits for that move instead of starting a second one (the turn is then pinned to the
slot the move filled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from hydrad.common.logs import log_event
from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.kvmove import TransferMeter
from hydrad.coordinator.pdsplit import TransferRates
from hydrad.coordinator.routing import DEFAULT_POLICY, ModelSpec
from hydrad.coordinator.sessions import SessionKeeper
from hydrad.wire.openai import ApiError

log = logging.getLogger("hydra.coordinator")

LEAVING_STAGES = frozenset({"reloading", "stopping"})  # the engine's KV goes soon: move its sessions first


class SessionMobility:
    """Owns the moves of sessions' KV between engines (``sessions`` keeps and restores; ``meter``
    learns the transfer speed from every move)."""

    def __init__(self, bus: CoordinatorBus, sessions: SessionKeeper | None, affinity: Affinity,
                 meter: TransferMeter, specs: dict[str, ModelSpec]) -> None:
        self.bus, self.sessions, self.affinity, self.meter, self.specs = bus, sessions, affinity, meter, specs
        self._moving: dict[str, asyncio.Task[bool]] = {}

    async def move_session(self, session: str, engine: str) -> dict[str, Any]:
        """``hydractl migrate SESSION ENGINE``: the session's KV to ``engine`` now; 4xx/409 say why not."""
        if self.sessions is None:
            raise ApiError(409, "sessions are not kept (sessions.keep is false)", "sessions_off")
        model = self.sessions.model_of(session)
        if model is None:
            raise ApiError(404, f"no session {session!r} is kept", "session_not_found", "session")
        rec = self.bus.engines.get(engine)
        if rec is None or not rec.alive:
            raise ApiError(404, f"no live engine {engine!r}", "engine_not_found", "engine")
        if rec.status.model != model or rec.status.stage != "ready":
            raise ApiError(409, f"{engine} does not serve {model} now (it serves {rec.status.model or 'nothing'}, "
                           f"stage {rec.status.stage})", "incompatible", "engine")
        if self.affinity.engine_of(session) == engine:
            return {"session": session, "engine": engine, "moved": False, "why": "already there"}
        moved: Any = await self.sessions.move(session, engine)
        if moved is not None:
            self.meter.record(moved, rec.status.kv_family)
            how = "engine"
        else:
            restored = await self.sessions.restore(session, engine)  # its KV left its slot: from the Store
            if restored is None:
                raise ApiError(409, f"session {session!r} could not be moved to {engine} (no idle slot, or its "
                               "KV is gone from its engine and the Store)", "not_moved")
            self.affinity.pin(session, engine, restored.slot)
            moved, how = restored, "store"
        self.affinity.record(engine, session, None, None)
        return {"session": session, "engine": engine, "moved": True, "from": how, "slot": moved.slot,
                "n_tokens": moved.n_tokens, "seconds": round(moved.seconds, 6)}

    async def evacuate(self, engine: str, stage: str) -> None:
        """``engine`` is about to lose its KV (a reload, a stop): move every session it holds to the least
        busy other engine serving the same model, engine to engine, so their next turns prefill nothing.
        A session whose turn is running there cannot be read now; :meth:`after_turn` moves it when that
        turn ends, while the engine still holds its KV."""
        if self.sessions is None:
            return
        moved = 0
        for session in self.affinity.left_on(engine):
            if await self._move_off(session, engine):
                moved += 1
        if moved:
            log_event(log, logging.INFO, "sessions moved off a leaving engine", engine=engine, stage=stage, sessions=moved)

    def after_turn(self, session: str | None, engine: str) -> None:
        """A turn ended on ``engine``; if the engine is leaving, its KV moves off now, before the engine
        drops it (the turn's next request would find it gone)."""
        rec = self.bus.engines.get(engine)
        if self.sessions is None or not session or rec is None or rec.status.stage not in LEAVING_STAGES:
            return
        self._move_off(session, engine)  # runs as a task of its own; a turn arriving meanwhile waits for it

    def _move_off(self, session: str, engine: str) -> asyncio.Future[bool]:
        """One move of ``session`` off ``engine`` at a time; a second call joins the first."""
        task = self._moving.get(session)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._move_to_best(session, engine))
            self._moving[session] = task
            task.add_done_callback(lambda t: self._moving.pop(session, None) if self._moving.get(session) is t else None)
        return asyncio.shield(task)

    async def _move_to_best(self, session: str, engine: str) -> bool:
        assert self.sessions is not None
        if self.affinity.engine_of(session) != engine:
            return False
        model = self.sessions.model_of(session)
        targets = sorted((r for r in self.bus.engines.values()
                          if r.name != engine and r.alive and r.status.stage == "ready" and r.status.model == model),
                         key=lambda r: (self.bus.inflight(r.name), r.heard_load(), r.name))
        if not targets:
            return False
        moved = await self.sessions.move(session, targets[0].name)
        if moved is None:
            return False
        self.meter.record(moved, targets[0].status.kv_family)
        self.affinity.record(targets[0].name, session, None, None)
        return True

    async def restore(self, session: str | None, engine: str) -> int | None:
        """The slot to pin a turn to when the session's KV was moved to ``engine`` or has to be brought
        there from the Store; None when the engine holds it already, nothing is kept, or the restore
        did not work."""
        if self.sessions is None or not session:
            return None
        moving = self._moving.get(session)
        if moving is not None and not moving.done():  # being moved off a leaving engine: take what it places
            with contextlib.suppress(Exception):
                await asyncio.shield(moving)
        pinned = self.affinity.pinned(session, engine)
        if pinned is not None:
            return pinned
        home = self.affinity.engine_of(session)
        if home == engine:  # its KV is there; pinned when the engine holds it as foreign (see Latest.placed)
            return self.affinity.slot_of(session, engine)
        target = self.bus.engines.get(engine)
        if target is not None and target.status.stage in LEAVING_STAGES:  # it would drop the KV with its old generation
            return None
        if not self.sessions.knows(session):
            return None
        model = self.sessions.model_of(session)
        if not self.transfer_pays(self.sessions.kept_tokens(session, model), engine, model):
            log_event(log, logging.INFO, "session prefilled: the engine computes it faster than its KV moves",
                      session=session, engine=engine)
            return None
        src = self.bus.engines.get(home) if home is not None else None
        if src is not None and src.alive and (src.status.stage == "ready" or src.status.stage in LEAVING_STAGES):
            # routing passed over the engine holding the session (its wait was too long, or it is
            # reloading or stopping and still holds the KV of the turn that just ended there, which
            # the evacuation could not move while that turn ran): move the KV from there, engine to
            # engine, rather than reading the last kept turn from the Store
            moved = await self.sessions.move(session, engine)
            if moved is not None:
                dst = self.bus.engines.get(engine)
                self.meter.record(moved, dst.status.kv_family if dst is not None else None)
                self.affinity.pinned(session, engine)  # this turn takes the slot now
                why = "busy" if src.status.stage == "ready" else src.status.stage
                log_event(log, logging.INFO, f"session moved off a {why} engine", session=session, src=home,
                          dst=engine)
                return moved.slot
        restored = await self.sessions.restore(session, engine)  # type: ignore[arg-type]
        return restored.slot if restored is not None else None

    def transfer_pays(self, tokens: int, engine: str, model: str | None) -> bool:
        """Whether bringing ``tokens`` of KV to ``engine`` (moved or restored) beats prefilling them there,
        by the engine's measured prefill speed and the measured transfers (routing's estimate for the
        split and for lukewarm candidates). A small model on a fast GPU prefills faster than its KV
        moves: below that crossover the turn just prefills. Unmeasured speeds keep the KV."""
        rec = self.bus.engines.get(engine)
        tps = rec.status.prefill_tps if rec is not None else 0.0
        spec = self.specs.get(model or "")
        per_token = self.meter.bytes_per_token(rec.status.kv_family if rec is not None else None) or (
            spec.kv_bytes_per_token if spec is not None else 0)
        if tokens <= 0 or tps <= 0 or per_token <= 0:
            return True
        rates = TransferRates.of(self.meter)
        bandwidth = rates.bytes_per_s if rates.bytes_per_s > 0 else DEFAULT_POLICY.restore_bytes_per_s
        fixed = rates.fixed_s if rates.transfers > 0 else DEFAULT_POLICY.transfer_fixed_s
        return fixed + tokens * per_token / bandwidth < tokens / tps

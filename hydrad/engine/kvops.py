"""KV-state operations of the engine: a slot's state read and restored between steps, the cheap
checks before an upload is accepted, and the KV carried from one generation to a sibling one.

:class:`KvMover` is the engine core's component for it; ``get``/``put``/``erase`` run on the
engine thread, the ``state_*`` coroutines on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from hydrad.common.logs import log_event
from hydrad.engine.commands import StateErase, StateGet, StatePut
from hydrad.engine.generation import Generation, Slot
from hydrad.engine.statebuf import StateBuffers


log = logging.getLogger("hydrad.engine")


class StateError(Exception):
    """A state request that cannot be served; ``kind`` maps to a protocol status."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # not_found | conflict | incompatible | failed


class KvMover:
    """Moves slots' KV in and out between steps: owns the state buffers (snapshots read and uploads
    being received, which any thread may take)."""

    def __init__(self, core: Any) -> None:  # the EngineCore this is part of (it imports us)
        self.core = core
        self.buffers = StateBuffers()

    def _idle_slot(self, slot_id: int) -> tuple[Generation, Slot]:
        gen = self.core.gen
        if gen is None:
            raise StateError("no model is loaded", "not_found")
        if not 0 <= slot_id < len(gen.slots):
            raise StateError(f"slot {slot_id} does not exist (this engine has {len(gen.slots)})", "not_found")
        slot = gen.slots[slot_id]
        if slot.active is not None:
            raise StateError(f"slot {slot_id} is busy with a request; retry when it is idle", "conflict")
        return gen, slot

    def get(self, cmd: StateGet) -> None:
        fut = cmd.fut
        try:
            gen, slot = self._idle_slot(cmd.slot_id)
            data = gen.read_state(slot, self.buffers)
            fut.set_result((gen.state_meta(slot, len(data)), data))
        except Exception as exc:
            fut.set_exception(exc)

    def put(self, cmd: StatePut) -> None:
        slot_id, meta, data, fut, trusted = cmd.slot_id, cmd.meta, cmd.data, cmd.fut, cmd.trusted
        try:
            gen, slot = self._idle_slot(slot_id)
            problem = gen.incompatibility(meta)
            if problem:
                raise StateError(problem, "incompatible")
            t0 = time.monotonic()
            # untrusted KV: see Slot.foreign; trusted KV (an operator's slot file, the pool's own move) is
            # in the shared cache namespace, which tenants reach only through the pool's own pin (Slot.owner)
            gen.write_state(slot, meta["tokens"], data, foreign=not trusted, owner="" if trusted else None)
            slot.last_used = time.monotonic()
            fut.set_result({"slot": slot_id, "n_tokens": len(slot.cache), "seconds": round(time.monotonic() - t0, 6)})
        except Exception as exc:
            fut.set_exception(exc)

    def erase(self, cmd: StateErase) -> None:
        try:
            gen, slot = self._idle_slot(cmd.slot_id)
            n = len(slot.cache)
            gen.reset_slot(slot)
            cmd.fut.set_result(n)
        except Exception as exc:
            cmd.fut.set_exception(exc)

    def check_put(self, slot_id: int, meta: Any, max_bytes: int) -> StateError | None:
        """Cheap checks before any state byte is accepted, so a doomed upload is refused up front."""
        gen = self.core.gen
        if gen is None:
            return StateError("no model is loaded", "not_found")
        if not 0 <= slot_id < len(gen.slots):
            return StateError(f"slot {slot_id} does not exist (this engine has {len(gen.slots)})", "not_found")
        problem = gen.incompatibility(meta)
        if problem:
            return StateError(problem, "incompatible")
        size = meta.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= max_bytes:  # JSON true is no size
            return StateError(f"meta.bytes must be 1..{max_bytes}, got {size!r}", "too_large")
        return None

    async def state_get(self, slot_id: int) -> tuple[dict[str, Any], Any]:
        """A slot's KV state (meta, bytes), read on the engine thread between steps."""
        cmd = StateGet(slot_id)
        self.core.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    async def state_put(self, slot_id: int, meta: dict[str, Any], data: Any, trusted: bool = False) -> dict[str, Any]:
        """Restore a slot from meta + bytes; an incompatible state leaves the slot untouched."""
        cmd = StatePut(slot_id, meta, data, trusted)
        self.core.put(cmd)
        return await asyncio.wrap_future(cmd.fut)

    async def state_erase(self, slot_id: int) -> int:
        """Empty an idle slot's KV between steps; how many tokens it held."""
        cmd = StateErase(slot_id)
        self.core.put(cmd)
        return await asyncio.wrap_future(cmd.fut)


def sibling_problem(old: Generation, new: Generation) -> str | None:
    """Two quants of one model share architecture and KV layout; only then can KV move between them."""
    a, b = old.identity(), new.identity()
    for key in ("arch", "n_layer", "n_embd", "n_head_kv", "n_vocab"):
        if a[key] != b[key]:
            return (f"'{new.resolved.id}' is not a sibling quant of '{old.resolved.id}': {key} {b[key]!r} != {a[key]!r}; "
                    "the current model keeps serving")
    if a["family"] != b["family"]:
        return (f"'{new.resolved.id}' is not a sibling quant of '{old.resolved.id}': same layout but another vocabulary; "
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
            new.write_state(new.slots[slot.id], list(slot.cache), data, foreign=slot.foreign, owner=slot.owner)
            new.slots[slot.id].last_used, new.slots[slot.id].exact = slot.last_used, slot.exact
            carried += 1
        except RuntimeError as exc:
            log_event(log, logging.WARNING, "slot KV not carried", slot=slot.id, error=str(exc))
            dropped += 1
    return {"carried": carried, "dropped": dropped}


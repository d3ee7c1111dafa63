"""The first half of a prefill/decode split, run: the prefill engine computes the prompt's KV, and
the KV streams into an idle slot of the decode engine (``pdsplit`` plans it; the front door sends
the request, pinned to that slot, to the decode engine)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from hydrad.common.logs import log_event
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.kvmove import Placements, TransferMeter, stream_slot
from hydrad.coordinator.pdsplit import SplitPlan
from hydrad.coordinator.records import EngineLost, EngineUnreachable, RequestUnsendable
from hydrad.wire import messages as M
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import GenRequest, SamplingOverrides
from hydrad.wire.rpcclient import RpcError

log = logging.getLogger("hydra.coordinator")


def generate_message(req: str, greq: GenRequest, model: str | None) -> M.Generate:
    """GENERATE for a parsed request; a request the bus message cannot represent is a 400."""
    try:
        return M.Generate.from_request(req, greq, model)
    except ValueError as exc:  # pydantic's ValidationError, e.g. more stop strings than the bus carries
        raise ApiError(400, f"the request cannot be sent to an engine: {M._first_error(exc)}",
                       "invalid_request") from None


class SplitRunner:
    def __init__(self, settings: Any, bus: CoordinatorBus, meter: TransferMeter, placements: Placements,
                 engine_token: str | None) -> None:
        self.settings, self.bus, self.meter, self.placements, self.engine_token = (
            settings, bus, meter, placements, engine_token)

    async def run(self, plan: SplitPlan, greq: GenRequest, rid: str) -> int | None:
        """Run the plan's first half: the prefill engine computes the prompt's KV (one greedy token, which
        is thrown away), the KV streams into an idle slot of the decode engine, and that slot is returned
        for the request to be pinned to. None when any of it fails: the decode engine then prefills the
        prompt itself, so the split can make a request slower, never fail it."""
        src, dst = self.bus.engines.get(plan.prefill), self.bus.engines.get(plan.decode)
        if src is None or dst is None or not src.info.rpc or not dst.info.rpc:
            return None
        t0 = time.monotonic()
        first = replace(greq, max_tokens=1, stop=[], sampling=SamplingOverrides(temperature=0.0), ignore_eos=False,
                        return_tokens=False, slot=None, logprobs=None, return_progress=False,
                        report_settings=False)
        done: M.Done | None = None
        why = ""
        try:
            stream = self.bus.generate(plan.prefill, generate_message(self.bus.new_id("gen"), first, plan.prefill_model))
        except (RequestUnsendable, EngineUnreachable, ApiError) as exc:  # the prefill half only: D still serves
            stream, why = None, str(exc)
        try:
            while stream is not None:
                ev = await stream.next(self.settings.first_token_timeout_s)
                if isinstance(ev, M.Done):
                    done = ev
                    break
                if ev is None or isinstance(ev, (M.Error, EngineLost)):
                    why = getattr(ev, "message", None) or getattr(ev, "reason", None) or "no answer in time"
                    break
        finally:
            if stream is not None:
                self.bus.cancel(stream)
        prefill_s = time.monotonic() - t0
        moved = None
        if done is not None and done.slot is not None:
            try:
                async with self.placements.lock(dst.name):
                    moved = await asyncio.get_running_loop().run_in_executor(
                        None, stream_slot, src.info.rpc, done.slot, dst.info.rpc, self.engine_token,
                        self.settings.sessions.io_timeout_s, done.kv_hash)
            except (OSError, RpcError, ValueError) as exc:
                why = f"the KV did not move: {exc}"
            else:
                why = why or "the prefill slot was taken by another request, or the decode engine has no idle slot"
        if moved is None:
            log_event(log, logging.WARNING, "split abandoned; the decode engine prefills", req=rid,
                      prefill=plan.prefill, decode=plan.decode, error=why)
            self.bus.publish("split", req=rid, ok=False, error=why, **plan.public())
            return None
        self.meter.record(moved, dst.status.kv_family)
        log_event(log, logging.INFO, "split", req=rid, prefill=plan.prefill, decode=plan.decode, tokens=moved.n_tokens,
                  bytes=moved.n_bytes, prefill_s=round(prefill_s, 4), transfer_s=round(moved.seconds, 4))
        self.bus.publish("split", req=rid, ok=True, slot=moved.slot, tokens=moved.n_tokens,
                         measured_prefill_s=round(prefill_s, 4),
                         measured_transfer_s=round(moved.seconds, 4), **plan.public())
        return moved.slot

"""The prefill/decode split: whether one engine should prefill a request and another decode it.

Engine P computes the prompt's KV, the coordinator streams that KV to engine D over their merged
ports, and D decodes from it. P and D serve the same model or sibling quants of it (the same KV
family, as the engines report it), so P may run a more precise quant on a faster GPU and D a
smaller one. It pays when P's prefill is so much faster than the decode engine's that the saving
outweighs the transfer, e.g. a long prompt for a model only a slow GPU serves, while a fast GPU
serving a sibling quant has a free slot.

The decision is a pure function of what the engines last reported (their measured prefill and
decode speeds, slots and queues) and of what transfers measured (:class:`TransferMeter`): the
split's whole time (P's wait + prefill + transfer + a round trip, then D's wait, one prompt
token and the decode) against the whole time of the best single engine (routing's TTFT estimate
plus its decode). No token-count threshold: the numbers decide, and an engine that has not
measured its speeds yet is never part of a plan (its defaults are guesses). Nothing here does
I/O or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hydrad.coordinator.routing import (
    DEFAULT_POLICY, Decision, EngineView, ModelSpec, RouteRequest, RoutingPolicy, expected_wait,
)


@dataclass(frozen=True)
class TransferRates:
    """What engine-to-engine transfers measured (``kvmove.TransferMeter``); 0 = nothing yet."""

    bytes_per_s: float = 0.0
    bytes_per_token: Mapping[str, float] = None  # type: ignore[assignment]  # KV family → bytes per token
    fixed_s: float = 0.0  # per transfer, beside the bytes (meaningful once a transfer was measured)
    transfers: int = 0

    @classmethod
    def of(cls, meter: Any) -> "TransferRates":
        """A snapshot of a ``kvmove.TransferMeter``."""
        return cls(meter.bytes_per_s, dict(meter.per_token), meter.fixed_s, meter.transfers)

    def per_token(self, family: str | None) -> float:
        return float((self.bytes_per_token or {}).get(family or "", 0.0))


@dataclass(frozen=True)
class SplitPlan:
    """A priced prefill/decode split, and the single engine it beats."""

    prefill: str  # engine P
    decode: str  # engine D (serves the requested model)
    prefill_model: str  # what P serves (the model itself or a sibling quant)
    prefill_s: float  # P's wait + prefill of the whole prompt + its one greedy token
    transfer_s: float  # fixed part + the KV's bytes ÷ measured speed + a bus round trip
    decode_s: float  # D's wait + its last prompt token + max_tokens at D's decode speed
    total_s: float
    single: str  # the best single engine
    single_s: float  # its TTFT estimate + decode
    kv_bytes: int

    def public(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode, "prefill_model": self.prefill_model,
                "prefill_s": _r(self.prefill_s), "transfer_s": _r(self.transfer_s), "decode_s": _r(self.decode_s),
                "total_s": _r(self.total_s), "single": self.single, "single_s": _r(self.single_s),
                "kv_bytes": self.kv_bytes}


def _free_slot(e: EngineView) -> bool:
    return e.slots_busy < e.slots_total


def _measured(e: EngineView) -> bool:
    return e.prefill_tps > 0 and e.decode_tps > 0


def split_excluded(req: RouteRequest, decision: Decision) -> str | None:
    """Why no split can apply, judged from the request and the routing decision alone (so before the
    engines' views are built: that is most of a plan's cost, paid per request); None when one might."""
    if decision.engine is None or not decision.candidates:
        return "no engine for the request"
    if decision.step != "cost":
        return f"routing chose {decision.engine} by {decision.step}: its KV is already there"
    if req.stored_tokens > 0:
        return "the session's KV is kept in the Store: restored, not prefilled"
    return None


def plan_split(req: RouteRequest, decision: Decision, engines: Sequence[EngineView],
               models: Mapping[str, ModelSpec], rates: TransferRates, *,
               policy: RoutingPolicy = DEFAULT_POLICY) -> tuple[SplitPlan | None, str]:
    """The cheapest split that beats every single engine, or None and why not (one sentence)."""
    why_not = split_excluded(req, decision)
    if why_not is not None:
        return None, why_not
    by_name = {e.name: e for e in engines}
    singles: list[tuple[float, str]] = []
    for c in decision.candidates:
        e = by_name.get(c.engine)
        if e is None or c.lukewarm or c.warm:
            continue
        if not _measured(e):
            return None, f"{e.name} has not measured its speeds yet"
        singles.append((c.cost_s + max(0, req.max_tokens) / e.decode_tps, c.engine))
    if not singles:
        return None, "no cold candidate to compare with"
    single_s, single = min(singles)
    spec = models.get(req.model or "")
    prompt = max(1, req.prompt_tokens)
    best: SplitPlan | None = None
    why = "no engine of the same KV family has a free slot and measured speeds"
    for c in decision.candidates:
        d = by_name.get(c.engine)
        if d is None or c.load_s > 0 or not d.kv_family or not _free_slot(d) or not _measured(d):
            continue
        per_token = rates.per_token(d.kv_family) or (spec.kv_bytes_per_token if spec is not None else 0)
        if per_token <= 0:
            why = f"the KV size per token of {req.model} is unknown (not in the registry, never measured)"
            continue
        kv_bytes = int(per_token * prompt)
        bandwidth = rates.bytes_per_s if rates.bytes_per_s > 0 else policy.restore_bytes_per_s
        fixed = rates.fixed_s if rates.transfers > 0 else policy.transfer_fixed_s
        transfer = fixed + kv_bytes / bandwidth + policy.split_round_trip_s
        decode = expected_wait(req, d, policy) + 1 / d.prefill_tps + max(0, req.max_tokens) / d.decode_tps
        for p in engines:
            if (p.name == d.name or not p.alive or p.stage != "ready" or p.model is None or p.lends_only
                    or p.kv_family != d.kv_family or not _free_slot(p) or not _measured(p)):
                continue
            prefill = expected_wait(req, p, policy) + prompt / p.prefill_tps + 1 / p.decode_tps  # + its one token
            total = prefill + transfer + decode
            if best is None or total < best.total_s:
                best = SplitPlan(p.name, d.name, p.model, prefill, transfer, decode, total, single, single_s,
                                 kv_bytes)
    if best is None:
        return None, why
    if best.total_s >= single_s:
        return None, (f"no split pays: the best, {best.prefill} → {best.decode}, takes {best.total_s:.2f} s "
                      f"against {single_s:.2f} s on {single} alone")
    return best, (f"{best.prefill} prefills, {best.decode} decodes: {best.total_s:.2f} s (prefill "
                  f"{best.prefill_s:.2f} + transfer {best.transfer_s:.2f} + decode {best.decode_s:.2f}) "
                  f"against {single_s:.2f} s on {single} alone")


def _r(x: float) -> float:
    return round(x, 4)


__all__ = ["SplitPlan", "TransferRates", "plan_split", "split_excluded"]

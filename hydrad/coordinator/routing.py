"""Where a request should run: four pure steps over a snapshot of the engines.

The coordinator calls :func:`route` with what the bus last heard from every engine and what
the registry knows about the models. Nothing here does I/O or reads a clock, so a decision
can be replayed from its logged inputs and every step is tested on crafted snapshots.

The steps, in the order they decide (``docs/routing.md`` has the formulas):

1. :func:`affinity` — an engine that already holds the session's (or prefix's) KV wins
   outright, unless its wait is much longer than the whole cost of going elsewhere.
2. :func:`filter_candidates` — alive, routable stage, not excluded, not a model-less COMBINE
   peer, serves or can load the model, and has a free slot or queue room.
3. :func:`feasible` — an engine that would have to load the model must fit weights + KV in
   its VRAM and support the quant on its GPU architecture.
4. :func:`cost` — expected wait + load time + uncached prefill; the cheapest wins.

Step 1 is listed first because it overrides the others, but it needs step 4's numbers to
apply its margin, so :func:`route` scores the candidates first and asks step 1 last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from hydrad.wire.stages import ROUTABLE_STAGES, SERVING_STAGES, SLEEPING

GIB = 1 << 30



@dataclass(frozen=True)
class EngineView:
    """One engine as the coordinator last heard of it (REGISTER plus the latest heartbeat)."""

    name: str
    alive: bool
    stage: str  # idle | loading_model | warming | ready | reloading | sleeping (model named, freed) | stopping
    model: str | None  # alias currently served
    models_on_disk: frozenset[str]  # aliases this engine can load
    slots_busy: int
    slots_total: int
    queued: int
    max_queue: int = 64
    vram_total: int = 0  # bytes; 0 = unknown (CPU engine: treat as fitting)
    vram_free: int = 0
    gpu_arch: str = "cpu"  # e.g. sm_60, sm_86, sm_120, cpu
    prefill_tps: float = 0.0  # measured; 0 = unknown → the policy's conservative default
    decode_tps: float = 0.0
    load_seconds: float | None = None  # measured load time of `model` if known
    sessions: frozenset[str] = frozenset()  # session ids whose KV this engine holds
    cached_prefixes: frozenset[str] = frozenset()  # prefix hashes it holds (optional)
    role: str = "solo"  # COMBINE role the engine reports: solo | head | peer | head+peer
    kv_family: str | None = None  # the served model's KV family: sibling quants share it (pdsplit)
    host_weights: Mapping[str, int] = field(default_factory=dict)  # model → bytes of weights a load here keeps off the GPU
    models_fetchable: frozenset[str] = frozenset()  # aliases it may load after fetching the file from the pool

    @property
    def lends_only(self) -> bool:
        """A COMBINE peer with no model of its own: its devices compute a head's layers."""
        return "peer" in self.role.split("+") and self.model is None


@dataclass(frozen=True)
class ModelSpec:
    """What placement needs to know about a model; 0 bytes means unknown."""

    alias: str
    size_bytes: int
    kv_bytes_per_token: int
    quant: str | None = None
    arch: str | None = None

    @classmethod
    def from_entry(cls, alias: str, entry: Any) -> "ModelSpec":
        """Build from a registry entry (anything with ``size_bytes``/``kv_bytes_per_token``/...)."""
        return cls(
            alias=alias,
            size_bytes=int(getattr(entry, "size_bytes", None) or 0),
            kv_bytes_per_token=int(getattr(entry, "kv_bytes_per_token", None) or 0),
            quant=getattr(entry, "quant", None),
            arch=getattr(entry, "arch", None),
        )


@dataclass(frozen=True)
class RouteRequest:
    """The parts of an OpenAI request that matter for placement."""

    model: str | None  # None = an engine that serves something: the default (first registry alias served)
    prompt_tokens: int
    max_tokens: int = 256
    session_id: str | None = None
    prefix_hash: str | None = None
    n_ctx: int = 8192
    stored_tokens: int = 0  # tokens of this session kept in the Store: any engine serving the model restores them


@dataclass(frozen=True)
class Candidate:
    """A feasible engine and its estimated seconds until the request's first token."""

    engine: str
    cost_s: float
    wait_s: float
    load_s: float
    prefill_s: float
    warm: bool
    lukewarm: bool = False  # not warm, but the session's KV is in the Store: restored, not prefilled
    restore_s: float = 0.0  # part of prefill_s: reading the stored tokens back (lukewarm only)

    def public(self) -> dict[str, Any]:
        out = {"engine": self.engine, "cost_s": _r(self.cost_s), "wait_s": _r(self.wait_s),
               "load_s": _r(self.load_s), "prefill_s": _r(self.prefill_s), "warm": self.warm}
        if self.lukewarm:
            out.update(lukewarm=True, restore_s=_r(self.restore_s))
        return out


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`route`, complete enough to log and to explain to an operator."""

    engine: str | None  # None = no candidate
    step: str  # "affinity" | "cost" | "none"
    reason: str  # one human sentence
    candidates: tuple[Candidate, ...]  # scored, cheapest first
    rejected: Mapping[str, str]  # engine → "<step>: <why>"
    model: str | None = None  # the alias routed for (resolved when the request named none)

    def public(self) -> dict[str, Any]:
        """JSON-able form for the log line and the bus event."""
        return {
            "engine": self.engine,
            "model": self.model,
            "step": self.step,
            "reason": self.reason,
            "candidates": [c.public() for c in self.candidates],
            "rejected": dict(sorted(self.rejected.items())),
        }


@dataclass(frozen=True)
class RoutingPolicy:
    """The constants of the cost model; the defaults are deliberately pessimistic guesses."""

    affinity_margin_s: float = 2.0  # a warm engine may wait this much longer than going elsewhere costs
    default_prefill_tps: float = 100.0  # prompt tokens/s assumed before an engine has measured its own
    default_decode_tps: float = 10.0  # generated tokens/s per sequence, likewise
    disk_bytes_per_s: float = 2e9  # model load speed assumed when nothing was measured
    fetch_bytes_per_s: float = 1e8  # a model file's transfer from the pool before its load (about 1 GbE)
    unknown_load_s: float = 30.0  # load time charged when the model's size is unknown too
    warm_uncached_tokens: int = 256  # a warm engine still prefills the new turn; its length is unknown
    restore_bytes_per_s: float = 1e9  # Store → engine restore speed (read, verify, STATE_PUT), as measured on tmpfs;
    # also engine → engine KV transfers until the pool has measured its own (kvmove.TransferMeter)
    split_round_trip_s: float = 0.005  # the prefill/decode split's extra GENERATE → DONE on the bus
    transfer_fixed_s: float = 0.05  # an engine → engine KV transfer's fixed part, until the pool measured its own
    vram_reserve_bytes: int = 512 << 20  # CUDA context and compute buffers beside weights + KV
    load_on_demand: bool = True  # an engine that has the model on disk but serves another may load it


DEFAULT_POLICY = RoutingPolicy()


@dataclass(frozen=True)
class QuantRule:
    """A quant family an architecture should not be asked to run."""

    archs: frozenset[str]
    quant_prefix: str  # matched case-insensitively against the start of ModelSpec.quant
    why: str


# Kept small on purpose: only combinations known to be a bad idea. An architecture or quant
# not named here is allowed, and so is everything on CPU engines and unknown architectures.
QUANT_RULES: tuple[QuantRule, ...] = (
    QuantRule(frozenset({"sm_30", "sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61"}), "IQ",
              "I-quants run far slower than K-quants or legacy quants on Pascal and older GPUs"),
)


# --------------------------------------------------------------------------- step 2: filter


def filter_candidates(
    req: RouteRequest,
    engines: Sequence[EngineView],
    exclude: frozenset[str] = frozenset(),
    *,
    allow_load: bool = True,
) -> tuple[list[EngineView], dict[str, str]]:
    """Split engines into those that could take the request and those that cannot (with why).

    ``allow_load=False`` keeps only engines already serving ``req.model``: a request that named
    no model must not trigger a load, nor any request when loading on demand is off.
    """
    passed: list[EngineView] = []
    rejected: dict[str, str] = {}
    for e in engines:
        why = _filter_reason(req, e, exclude, allow_load)
        if why is None:
            passed.append(e)
        else:
            rejected[e.name] = f"filter: {why}"
    return passed, rejected


def _filter_reason(req: RouteRequest, e: EngineView, exclude: frozenset[str], allow_load: bool) -> str | None:
    if e.name in exclude:
        return "excluded by the caller"
    if not e.alive:
        return "not alive (heartbeats missed)"
    if e.lends_only:
        return "a COMBINE peer: it lends its devices to a head and serves no model of its own"
    if e.stage not in ROUTABLE_STAGES:
        return f"stage {e.stage}"
    if req.model is None:
        return "the request names no model and none is served"
    if not allow_load:
        if not (e.model == req.model and e.stage in SERVING_STAGES | {SLEEPING}):
            served = e.model if e.model and e.stage in SERVING_STAGES else "nothing"
            return f"serves {served}, not {req.model}, and this request may not load a model"
    elif e.model != req.model and req.model not in e.models_on_disk and req.model not in e.models_fetchable:
        return f"neither serves nor has {req.model} on disk, nor can fetch it"
    if not has_room(e):
        return f"full: {e.slots_busy}/{e.slots_total} slots busy, {e.queued}/{e.max_queue} queued"
    return None


def has_room(e: EngineView) -> bool:
    """A free slot, or room in the engine's wait queue."""
    return e.slots_busy < e.slots_total or e.queued < e.max_queue


def serves(e: EngineView, model: str | None) -> bool:
    """The engine's current generation answers requests for ``model`` right now."""
    return model is not None and e.model == model and e.stage in SERVING_STAGES


def holds_kv(req: RouteRequest, e: EngineView) -> str | None:
    """What of the request's KV the engine holds, as words for the reason; None if nothing usable.

    Only a ready engine serving the model counts: a reloading one is about to drop its KV.
    """
    if req.model is None or e.model != req.model or e.stage != "ready":
        return None
    if req.session_id is not None and req.session_id in e.sessions:
        return f"session {req.session_id}"
    if req.prefix_hash is not None and req.prefix_hash in e.cached_prefixes:
        return f"prefix {req.prefix_hash}"
    return None


# --------------------------------------------------------------------------- step 3: feasibility


def feasible(
    req: RouteRequest,
    engine: EngineView,
    models: Mapping[str, ModelSpec],
    *,
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> str | None:
    """None when the engine can run the model, else why not.

    An engine already serving (or loading) the model has proven it fits and runs, so only
    engines that would load it are judged. Unknown sizes, unknown VRAM (0, e.g. a CPU engine)
    and unknown architectures are given the benefit of the doubt. The weights the engine says a
    load there keeps in host memory (``host_weights``: experts on the CPU, the token embeddings)
    do not count against its VRAM.
    """
    if req.model is None or engine.model == req.model:
        return None
    spec = models.get(req.model)
    if spec is None:
        return None
    need_kv = max(0, spec.kv_bytes_per_token) * max(0, req.n_ctx)
    host = min(max(0, engine.host_weights.get(req.model, 0)), max(0, spec.size_bytes))
    on_gpu = max(0, spec.size_bytes) - host
    need = on_gpu + need_kv
    if engine.vram_total > 0 and spec.size_bytes > 0 and need + policy.vram_reserve_bytes > engine.vram_total:
        kept = f", {_gib(host)} more kept in host memory" if host else ""
        return (f"{req.model} needs {_gib(need)} (weights {_gib(on_gpu)}{kept} + KV {_gib(need_kv)} "
                f"for {req.n_ctx} tokens) + {_gib(policy.vram_reserve_bytes)} reserve, "
                f"{engine.name} has {_gib(engine.vram_total)}")
    why = quant_unsupported(spec.quant, engine.gpu_arch)
    if why:
        return f"{req.model} is {spec.quant}: {why} ({engine.gpu_arch})"
    return None


def quant_unsupported(quant: str | None, arch: str) -> str | None:
    """The rule of :data:`QUANT_RULES` that forbids ``quant`` on ``arch``, as its reason."""
    if not quant:
        return None
    q = quant.upper()
    a = arch.lower()
    for rule in QUANT_RULES:
        if a in rule.archs and q.startswith(rule.quant_prefix.upper()):
            return rule.why
    return None


# --------------------------------------------------------------------------- step 4: cost


def expected_wait(req: RouteRequest, e: EngineView, policy: RoutingPolicy = DEFAULT_POLICY) -> float:
    """Seconds until a slot frees up for this request.

    ``ahead`` counts the requests that must finish first: everything queued, plus one when all
    slots are busy. One request takes about ``max_tokens / decode_tps`` (the running ones'
    lengths are unknown, so ours stands in for them); with ``slots_total`` sequences decoding
    side by side, a slot frees up ``slots_total`` times as often.
    """
    slots = max(0, e.slots_total)
    busy_over = max(0, e.slots_busy - slots + 1) if slots > 0 else 0
    ahead = max(0, e.queued) + busy_over
    if ahead == 0:
        return 0.0
    per_request = max(0, req.max_tokens) / _rate(e.decode_tps, policy.default_decode_tps)
    return ahead * per_request / max(1, slots)


def load_estimate(
    model: str | None,
    e: EngineView,
    models: Mapping[str, ModelSpec],
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> float:
    """Seconds until the engine serves ``model``: 0 if it already does.

    The measured ``load_seconds`` is used only when it measured this very model; for another
    model it is no guide (a load has a fixed part — context, warm-up — that does not scale
    with size), so the model's size ÷ ``disk_bytes_per_s`` stands in, or ``unknown_load_s``
    when the size is unknown too. A model the engine must fetch first adds its size ÷
    ``fetch_bytes_per_s`` (twice ``unknown_load_s`` in all when the size is unknown), so an
    engine that has the file wins over one that would fetch it.
    """
    if model is None or serves(e, model):
        return 0.0
    if e.model == model and e.load_seconds is not None and _known(e.load_seconds):
        return e.load_seconds
    spec = models.get(model)
    fetch = model not in e.models_on_disk and model in e.models_fetchable and e.model != model
    if spec is None or spec.size_bytes <= 0:
        return policy.unknown_load_s * (2 if fetch else 1)
    load = spec.size_bytes / _rate(policy.disk_bytes_per_s, DEFAULT_POLICY.disk_bytes_per_s)
    return load + (spec.size_bytes / _rate(policy.fetch_bytes_per_s, DEFAULT_POLICY.fetch_bytes_per_s) if fetch else 0.0)


def cost(
    req: RouteRequest,
    e: EngineView,
    models: Mapping[str, ModelSpec],
    *,
    warm: bool = False,
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> Candidate:
    """Estimated seconds to the first token on ``e``: wait + load + uncached prefill.

    Without affinity no prompt token is assumed cached; a warm engine still prefills the new
    turn, charged as at most ``warm_uncached_tokens``.
    """
    wait = expected_wait(req, e, policy)
    load = load_estimate(req.model, e, models, policy)
    prompt = max(0, req.prompt_tokens)
    uncached = min(prompt, max(0, policy.warm_uncached_tokens)) if warm else prompt
    rate = _rate(e.prefill_tps, policy.default_prefill_tps)
    prefill = uncached / rate
    restore, lukewarm = 0.0, False
    if not warm and req.stored_tokens > 0 and req.model is not None and e.stage == "ready":
        # (a reloading engine would drop KV placed there with its old generation: no lukewarm there)
        # lukewarm: the kept tokens are restored (bytes ÷ restore speed) and only the rest is prefilled,
        # when that is the cheaper way (an engine makes the same choice by its own measurements)
        stored = min(prompt, req.stored_tokens)
        spec = models.get(req.model)
        per_token = spec.kv_bytes_per_token if spec is not None and spec.kv_bytes_per_token > 0 else 0
        restore = stored * per_token / _rate(policy.restore_bytes_per_s, DEFAULT_POLICY.restore_bytes_per_s)
        if restore < stored / rate:
            prefill, lukewarm = restore + (prompt - stored) / rate, True
        else:
            restore = 0.0
    return Candidate(engine=e.name, cost_s=wait + load + prefill, wait_s=wait, load_s=load,
                     prefill_s=prefill, warm=warm, lukewarm=lukewarm, restore_s=restore)


def rank(candidates: Sequence[Candidate], engines: Mapping[str, EngineView]) -> tuple[Candidate, ...]:
    """Cheapest first; ties (to the microsecond) go to fewer busy slots, then to the name."""
    def key(c: Candidate) -> tuple[float, int, str]:
        e = engines.get(c.engine)
        return (round(c.cost_s, 6), e.slots_busy if e is not None else 0, c.engine)
    return tuple(sorted(candidates, key=key))


# --------------------------------------------------------------------------- step 1: affinity


@dataclass(frozen=True)
class AffinityVerdict:
    """The warm engine that wins outright (``engine``), or why none does (``engine`` None)."""

    engine: str | None
    reason: str  # empty when no engine was warm at all


def affinity(
    req: RouteRequest,
    engines: Sequence[EngineView],
    scored: Sequence[Candidate],
    *,
    margin_s: float = DEFAULT_POLICY.affinity_margin_s,
) -> AffinityVerdict:
    """Pick the warm engine among the scored candidates, unless waiting for it costs too much.

    A session match beats a prefix match; among equals the cheaper one. The warm engine wins
    unless its expected wait exceeds the best other candidate's total cost by more than
    ``margin_s`` (the session's KV would then be re-prefilled elsewhere, which that total
    already includes).
    """
    by_name = {e.name: e for e in engines}
    costs = {c.engine: c for c in scored}
    warm: list[tuple[int, float, str, str]] = []
    for name, c in costs.items():
        e = by_name.get(name)
        what = holds_kv(req, e) if e is not None and has_room(e) else None
        if what is not None:
            warm.append((0 if what.startswith("session") else 1, c.cost_s, name, what))
    if not warm:
        return AffinityVerdict(None, "")
    _, _, name, what = min(warm)
    mine = costs[name]
    others = [c for c in scored if c.engine != name]
    if others:
        best = min(others, key=lambda c: (round(c.cost_s, 6), c.engine))
        if mine.wait_s > best.cost_s + margin_s:
            return AffinityVerdict(None, (
                f"{what} is warm on {name}, but its wait {mine.wait_s:.2f} s exceeds {best.engine}'s "
                f"total {best.cost_s:.2f} s by more than the {margin_s:.2f} s margin"))
    return AffinityVerdict(name, f"{what} is warm on {name}")


# --------------------------------------------------------------------------- route


def default_model(
    engines: Sequence[EngineView],
    models: Mapping[str, ModelSpec],
    exclude: frozenset[str] = frozenset(),
) -> str | None:
    """The model a request without ``model`` gets: the first registry alias some engine serves (or,
    when none serves one, sleeps with: the request wakes it)."""
    live = [(e.model, e.stage) for e in engines if e.alive and e.name not in exclude and e.model is not None]
    served = {m for m, stage in live if stage in SERVING_STAGES} or {m for m, stage in live if stage == SLEEPING}
    for alias in models:
        if alias in served:
            return alias
    return min(served) if served else None


def route(
    req: RouteRequest,
    engines: Sequence[EngineView],
    models: Mapping[str, ModelSpec],
    *,
    exclude: frozenset[str] = frozenset(),
    policy: RoutingPolicy = DEFAULT_POLICY,
) -> Decision:
    """Choose the engine for ``req``; never raises, and says why about every engine."""
    unique: list[EngineView] = []
    seen: set[str] = set()
    for e in engines:
        if e.name not in seen:  # a duplicated name keeps its first view
            seen.add(e.name)
            unique.append(e)
    allow_load = req.model is not None and policy.load_on_demand
    if req.model is None:
        req = replace(req, model=default_model(unique, models, exclude))

    passed, rejected = filter_candidates(req, unique, exclude, allow_load=allow_load)
    fits: list[EngineView] = []
    for e in passed:
        why = feasible(req, e, models, policy=policy)
        if why is None:
            fits.append(e)
        else:
            rejected[e.name] = f"feasible: {why}"

    by_name = {e.name: e for e in fits}
    scored = rank([cost(req, e, models, warm=holds_kv(req, e) is not None, policy=policy) for e in fits], by_name)

    if not scored:
        return Decision(None, "none", _nothing_fits(req, unique, rejected), (), rejected, req.model)

    verdict = affinity(req, fits, scored, margin_s=policy.affinity_margin_s)
    if verdict.engine is not None:
        return Decision(verdict.engine, "affinity", verdict.reason, scored, rejected, req.model)
    best = scored[0]
    why = (f"cheapest for {req.model}: {best.engine}, {best.cost_s:.2f} s (wait {best.wait_s:.2f} + "
           f"load {best.load_s:.2f} + prefill {best.prefill_s:.2f})")
    if verdict.reason:
        why = f"{verdict.reason}; {why}"
    return Decision(best.engine, "cost", why, scored, rejected, req.model)


def _nothing_fits(req: RouteRequest, engines: Sequence[EngineView], rejected: Mapping[str, str]) -> str:
    if not engines:
        return "no engine is registered"
    what = req.model if req.model is not None else "a request without a model"
    parts = "; ".join(f"{name}: {why}" for name, why in sorted(rejected.items()))
    return f"no engine can take {what}: {parts}"


def _known(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x >= 0


def _rate(measured: float, default: float) -> float:
    """A measured speed when there is one, else the default (speeds of 0 mean 'not measured')."""
    if math.isfinite(measured) and measured > 0:
        return measured
    return default if math.isfinite(default) and default > 0 else 1.0


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _r(x: float) -> float:
    return round(x, 4)

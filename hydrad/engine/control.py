"""Configure semantics shared by every plane: HTTP (``/control/configure``), the merged RPC port
(ENGINE_CONFIGURE) and the bus (the coordinator's ``Configure`` message).

A payload is diffed against the applied snapshot and the highest changed tier decides what
happens: T1 applies at once, T2 rebuilds the context, T3 starts a model load. The runtime
layer is committed only when the change took effect, so a failed load leaves the old
configuration in force.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hydrad.engine.core import EngineBusy, EngineCore
from hydrad.engine.fetch import ModelFetcher
from hydrad.common.logs import log_event
from hydrad.common.params import ParamError, ParamLayers, RuntimeParams, Tier
from hydrad.common.registry import Registry, ResolvedModel, UnknownModel

log = logging.getLogger("hydrad.control")

T1_WAIT_S = 30.0  # longest a T1 configure waits for the engine thread to take its parameters

# Where COMBINE sends an MoE model's expert tensors unless told otherwise: the peer's first device
# (llama.cpp's -ot syntax; the regex is llama.cpp's own for expert FFN tensors).
EXPERTS_TO_PEER = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps=RPC"


class NoModel(RuntimeError):
    """An operation that needs a loaded model, on an engine without one."""


@dataclass
class ConfigureResult:
    tier: Tier
    changed: list[str]
    load_id: int | None = None
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tier": f"T{int(self.tier)}" if self.tier else "none",
                               "action": self.tier.action, "changed": self.changed}
        if self.load_id is not None:
            out["load_id"] = self.load_id
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 4)
        out.update(self.extra)
        return out


class EngineControl:
    def __init__(self, core: EngineCore, registry: Registry, yaml_defaults: dict[str, Any],
                 fetcher: ModelFetcher | None = None) -> None:
        self.core = core
        self.registry = registry
        self.fetcher = fetcher  # a model the disk lacks resolves as fetchable while it has a source
        if fetcher is not None:
            core.use_fetcher(fetcher)
        self.layers = ParamLayers(yaml=dict(yaml_defaults), model_defaults=registry.defaults_for)
        self.resolved: ResolvedModel | None = None
        self._pending_payload: dict[str, Any] | None = None  # what the running load applies
        self._loading_target: RuntimeParams | None = None  # the parameters the running load will serve with
        self._t1_latest: RuntimeParams | None = None  # the last T1 parameters a configure waits for
        core.set_defaults(self.layers.effective())
        core.on_peer_lost = self._peer_lost
        core.on_wake = self.wake

    # The payload that turns a COMBINE head back into SOLO: what a lost peer leaves as the fallback.
    SOLO = {"rpc_servers": None, "override_tensors": None, "tensor_split": None}

    def _peer_lost(self, reason: str) -> None:
        """On a peer watch thread: reload SOLO on the event loop. If the model does not fit alone, the
        load fails and the engine reports itself without a model (never ready while half-configured)."""
        self.core.on_loop(self._fall_back_solo(reason))

    async def _fall_back_solo(self, reason: str) -> None:
        log_event(log, logging.WARNING, "COMBINE peer lost; reloading SOLO", reason=reason)
        for _ in range(100):  # a load under way (rare: the peer died while this engine loaded) ends first
            try:
                await self.configure(dict(self.SOLO))
                break
            except EngineBusy:
                await asyncio.sleep(0.1)
            except Exception as exc:  # refused (e.g. no model configured): say so, keep running
                self.core.record_error(f"{reason}; SOLO reload refused: {exc}")
                return

    def effective(self) -> RuntimeParams:
        return self.layers.effective()

    def resolve(self, name: str) -> ResolvedModel:
        """The model ``name`` means; a registry model missing from disk resolves as one to fetch while this
        engine has a source to fetch from (the coordinator's offer, or ``fetch.url``)."""
        return self.registry.resolve(name, fetchable=self.fetcher is not None and self.fetcher.can_fetch)

    async def boot(self) -> ConfigureResult | None:
        """Load the YAML layer's model, if it names one (the engine is already READY by then), unless a
        configure that arrived on the bus meanwhile has started a load of its own."""
        eff = self.layers.effective()
        if eff.model is None:
            return None
        resolved = self.resolve(eff.model)
        await self._warm_load(eff)
        if self.core.current_load is not None:
            # a configure (the coordinator registering this engine) started a load while the estimate
            # was read: the newer instruction owns the engine, and the YAML's model is not loaded over it
            log_event(log, logging.INFO, "boot load skipped: a configure's load is under way",
                      load=self.core.current_load.id)
            return None
        rec = self.core.load(resolved, eff, on_success=lambda: self._loaded(resolved, None))
        self._loading_target = eff
        return ConfigureResult(Tier.T3, ["model"], load_id=rec.id)

    async def configure(self, payload: dict[str, Any]) -> ConfigureResult:
        """Apply a payload. Raises ParamError (400), UnknownModel (404) or EngineBusy (409).

        A configure that arrives while a model load runs either joins it, when the merged result is
        what that load will serve anyway (a coordinator asking for the model the YAML is already
        loading), or supersedes it: the payload is merged into the running load's payload,
        validated, the running load is aborted (the serving generation is untouched), and the
        merged payload is applied as one change, diffed against what is actually installed, so
        the aborted load's target is still loaded when the merged payload wants it."""
        await self._warm_ahead(payload)
        if self.core.current_load is None:
            self._pending_payload = None
            self._loading_target = None
        superseded = False
        running = self.core.current_load
        if running is not None:
            merged = {**(self._pending_payload or {}), **payload}
            target = self.layers.plan(merged)  # refuse a bad payload (or unknown model) before aborting a good load
            self.resolve_if_model(merged)
            if self._loading_target is not None and target.effective == self._loading_target:
                self.layers.commit(target)  # the same destination: let the running load get there
                self._pending_payload = merged
                log_event(log, logging.INFO, "configure joins the running load", load=running.id)
                return ConfigureResult(Tier.T3, target.changed, load_id=running.id, extra={"joined": True})
            log_event(log, logging.INFO, "configure supersedes a running load", load=running.id)
            await self.core.abort_load()
            payload = merged
            superseded = True
        plan = self.layers.plan(payload)
        # Superseding, or naming the model again after its load failed: the committed layers already
        # name the model, so the diff says "nothing to do", but it was never installed. Load it.
        asks_model = superseded or "model" in payload
        if asks_model and plan.tier < Tier.T3 and self._differs_from_installed(plan.effective):
            # the committed layers name a model the aborted load never installed
            plan = dataclasses.replace(plan, tier=Tier.T3, changed=sorted(set(plan.changed) | {"model"}))
        if plan.tier == Tier.NONE:
            self.layers.commit(plan)  # may drop an override equal to the value below it
            return ConfigureResult(Tier.NONE, [])
        log_event(log, logging.INFO, "configure", tier=f"T{int(plan.tier)}", changed=",".join(plan.changed))
        if plan.tier == Tier.T3:
            self._awake()
            if plan.effective.model is None:
                await self.core.unload()
                self.resolved = None
                self.layers.commit(plan)
                return ConfigureResult(Tier.T3, plan.changed)
            rec = self._start_load(plan, payload)
            return ConfigureResult(Tier.T3, plan.changed, load_id=rec.id,
                                   extra={"policy": rec.policy, "estimate": rec.estimate})
        if plan.tier == Tier.T2:
            result = await self.core.rebuild_context(plan.effective)
            self.layers.commit(plan)
            return ConfigureResult(Tier.T2, plan.changed, seconds=result.pop("seconds"), extra=result)
        self.core.set_defaults(plan.effective)
        self.layers.commit(plan)
        if not await self._in_force(plan.effective):
            return ConfigureResult(Tier.T1, plan.changed, extra={"pending": True})
        return ConfigureResult(Tier.T1, plan.changed)

    async def _warm_ahead(self, payload: Any) -> None:
        """Before a configure that loads a model: its estimate read ahead off the event loop. A payload
        that does not plan is left alone here; the configure itself refuses it."""
        try:
            merged = {**(self._pending_payload or {}), **payload} if self.core.current_load is not None else payload
            ahead = self.layers.plan(merged)
        except (ParamError, TypeError):
            return
        if ahead.tier == Tier.T3:
            await self._warm_load(ahead.effective)

    async def _warm_load(self, params: RuntimeParams) -> None:
        """The load's memory estimate (the GGUF's tensor table, placed by ``params``) computed on a worker
        thread, so that the load, started on the event loop, finds it ready: read there, a large
        vocabulary's header scan held the loop for tens of milliseconds."""
        if params.model is None:
            return
        try:
            resolved = self.resolve(params.model)
        except UnknownModel:
            return
        entry = resolved.entry
        await self.core.warm_estimate(resolved, params, entry.kv_bytes_per_token if entry else None)

    async def _in_force(self, params: RuntimeParams) -> bool:
        """Wait until the engine serves with ``params`` (T1): the engine thread takes them at its next
        turn, which a long prefill step can put seconds away, while a request's preparation off that
        thread (a chat's template and tokens) reads the parameters in force at once. A configure that
        answered before then left the next request rendered with the old ``chat_template``. False
        when they are not in force after ``T1_WAIT_S`` (the engine thread stalled or gone), or a later
        configure replaced them meanwhile (its own answer waits for them)."""
        self._t1_latest = params
        loop = asyncio.get_running_loop()
        deadline = loop.time() + T1_WAIT_S
        pause = 0.001
        while self.core.snapshot().params is not params:
            if self._t1_latest is not params:
                return True
            if not self.core.alive or loop.time() > deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)
        return True

    def _differs_from_installed(self, params: RuntimeParams) -> bool:
        """Whether serving ``params`` needs a model load from what is installed now."""
        gen = self.core.gen
        if gen is None:
            return params.model is not None
        return self._differs(gen.params, params, Tier.T3)

    def resolve_if_model(self, payload: dict[str, Any]) -> ResolvedModel | None:
        name = payload.get("model")
        return self.resolve(name) if isinstance(name, str) else None

    async def set_expert_mode(self, mode: Any, peer: Any = None, override_tensors: Any = None) -> dict[str, Any]:
        """Switch the loaded MoE model between SOLO (every tensor here) and COMBINE (its expert tensors on
        a peer). The first switch to a placement is a model load that keeps the generation it replaces
        resident as the *standby* (when both fit in memory: the overlap policy); every later switch
        between the two only exchanges them, in milliseconds. Refused (``SlotsBusy``) while a request
        decodes, never queued; raises ParamError for a bad request and ``NoModel`` without a model."""
        t0 = time.monotonic()
        gen = self.core.gen
        if gen is None:
            raise NoModel("no model is loaded; configure one first")
        if mode not in ("solo", "combine"):
            raise ParamError(f"mode must be 'solo' or 'combine', not {mode!r}", ["mode"])
        if not gen.n_expert:
            raise ParamError(f"{gen.resolved.id} is not a Mixture-of-Experts model (no expert tensors to move); "
                             "split a dense model with configure (rpc_servers, tensor_split)", ["mode"], code="not_moe")
        if mode == "solo":
            payload: dict[str, Any] = dict(self.SOLO)
        else:
            known = [g.params for g in (gen, self.core.standby) if g is not None and g.params.rpc_servers]
            if peer is None and not known:
                raise ParamError("combine needs a peer (host:port of its merged RPC port)", ["peer"])
            if peer is not None and not isinstance(peer, str):
                raise ParamError("peer must be a string, host:port", ["peer"])
            servers = [peer] if peer is not None else list(known[0].rpc_servers or [])
            ot = override_tensors if override_tensors is not None else (
                known[0].override_tensors if known and known[0].override_tensors else [EXPERTS_TO_PEER])
            payload = {"rpc_servers": servers, "override_tensors": ot, "tensor_split": [1.0, 0.0]}
        plan = self.layers.plan(payload)
        if not self._differs_from_installed(plan.effective):
            self.layers.commit(plan)
            return {"mode": mode, "switched": False, "resident": True, "seconds": round(time.monotonic() - t0, 6)}
        standby = self.core.standby
        if standby is not None and not self._differs(standby.params, plan.effective) and self.core.current_load is None:
            await self.core.switch_standby()
            self.layers.commit(plan)
            seconds = time.monotonic() - t0
            log_event(log, logging.INFO, "expert mode switched", mode=mode, seconds=round(seconds, 6))
            return {"mode": mode, "switched": True, "resident": True, "seconds": round(seconds, 6)}
        await self._warm_load(plan.effective)
        if self.core.current_load is not None:
            raise EngineBusy("a model load is under way; switch when it has finished")
        rec = self._start_load(plan, payload, keep_standby=True)
        return {"mode": mode, "switched": True, "resident": False, "load_id": rec.id, "policy": rec.policy,
                "estimate": rec.estimate}

    @staticmethod
    def _differs(a: RuntimeParams, b: RuntimeParams, at_least: Tier = Tier.T2) -> bool:
        """Whether two parameter sets differ in a field of tier ``at_least`` or above (T3: another model
        load; T2: another context too)."""
        return any(getattr(a, k) != getattr(b, k) for k in RuntimeParams.model_fields
                   if RuntimeParams.tier_of(k) >= at_least)

    def _start_load(self, plan: Any, payload: dict[str, Any], carry_kv: bool = False,
                    keep_standby: bool = False) -> Any:
        resolved = self.resolve(plan.effective.model)
        entry = resolved.entry

        def done() -> None:
            self._loaded(resolved, plan)
            self._pending_payload = None

        rec = self.core.load(resolved, plan.effective, on_success=done, policy=plan.effective.reload_policy,
                             carry_kv=carry_kv, kv_bytes_per_token=entry.kv_bytes_per_token if entry else None,
                             keep_standby=keep_standby)
        self._pending_payload = dict(payload)
        self._loading_target = plan.effective
        return rec

    async def swap_quant(self, model: str) -> ConfigureResult:
        """Reload a sibling quant of the serving model (same architecture and KV layout) and carry every
        slot's KV across, so sessions continue without re-prefill. A non-sibling is refused after its load
        and the current generation keeps serving."""
        gen = self.core.gen
        if gen is None:
            raise ParamError("swap_quant needs a loaded model to swap from", ["model"], code="no_model")
        if self.core.current_load is not None:
            raise EngineBusy(f"load {self.core.current_load.id} is under way; swap again when it has finished")
        resolved = self.resolve(model)
        cur = gen.resolved.entry
        if cur is not None and resolved.entry is not None and cur.arch and resolved.entry.arch \
                and cur.arch != resolved.entry.arch:
            raise ParamError(f"'{model}' ({resolved.entry.arch}) is not a sibling quant of '{gen.resolved.id}' "
                             f"({cur.arch})", ["model"], code="not_sibling")
        plan = self.layers.plan({"model": model})
        if plan.tier == Tier.NONE:
            return ConfigureResult(Tier.NONE, [])
        rebuilt = [k for k in plan.changed if k != "model" and RuntimeParams.tier_of(k) >= Tier.T2]
        if rebuilt:
            raise ParamError("swap_quant changes only the model; its registry defaults would change "
                             f"{', '.join(rebuilt)} too", rebuilt, code="not_sibling")
        log_event(log, logging.INFO, "swap quant", frm=gen.resolved.id, to=model)
        await self._warm_load(plan.effective)
        rec = self._start_load(plan, {"model": model}, carry_kv=True)
        return ConfigureResult(Tier.T3, plan.changed, load_id=rec.id, extra={"policy": rec.policy, "carry_kv": True})

    def _loaded(self, resolved: ResolvedModel, plan: Any) -> None:
        """Runs on the loader thread once the new generation is installed: commit the runtime layer."""
        if plan is not None:
            self.layers.commit(plan)
        self.resolved = resolved

    async def apply_yaml(self, defaults: dict[str, Any]) -> ConfigureResult:
        """SIGHUP: a re-read YAML ``defaults:`` block replaces the YAML layer; the diff is applied like a configure."""
        if self.core.current_load is not None:
            raise EngineBusy("a model load is under way; reload again when it has finished")
        old_yaml = self.layers.yaml
        shadowed = sorted(k for k in set(defaults) | set(old_yaml)
                          if k in self.layers.runtime and defaults.get(k) != old_yaml.get(k))
        if shadowed:  # a re-read that silently changed nothing left operators guessing
            log_event(log, logging.WARNING, "YAML change has no effect: a runtime setting (a configure, or the "
                      "coordinator's profile) overrides it", fields=",".join(shadowed),
                      runtime=",".join(f"{k}={self.layers.runtime[k]}" for k in shadowed))
        self.layers.yaml = dict(defaults)
        try:
            plan = self.layers.plan({})
        except ParamError:
            self.layers.yaml = old_yaml
            raise
        self.layers.yaml = old_yaml
        previous = self.layers.effective()
        self.layers.yaml = dict(defaults)
        changed = [k for k in RuntimeParams.model_fields if getattr(previous, k) != getattr(plan.effective, k)]
        tier = max((RuntimeParams.tier_of(k) for k in changed), default=Tier.NONE)
        if tier == Tier.NONE:
            return ConfigureResult(Tier.NONE, [])
        try:
            if tier == Tier.T3:
                self._awake()
            if tier == Tier.T3 and plan.effective.model is not None:
                resolved = self.resolve(plan.effective.model)
                await self._warm_load(plan.effective)
                self.layers.yaml = old_yaml  # the new YAML layer takes effect with the model

                def done() -> None:
                    self.layers.yaml = dict(defaults)
                    self._loaded(resolved, None)

                rec = self.core.load(resolved, plan.effective, on_success=done, policy=plan.effective.reload_policy)
                self._loading_target = plan.effective
                return ConfigureResult(tier, changed, load_id=rec.id)
            if tier == Tier.T3:
                await self.core.unload()
                self.resolved = None
            elif tier == Tier.T2:
                await self.core.rebuild_context(plan.effective)
            else:
                self.core.set_defaults(plan.effective)
                await self._in_force(plan.effective)
        except Exception:
            self.layers.yaml = old_yaml
            raise
        return ConfigureResult(tier, changed)

    def serves(self, name: str | None) -> bool:
        """Does a request's ``model`` field name what this engine has loaded (or freed while asleep)?"""
        if name is None or name == "":
            return True
        gen = self.core.gen
        if gen is not None:
            return name in gen.resolved.names()
        rec = self.core.current_load
        if rec is not None:
            return name == rec.model
        return self.core.asleep is not None and self.resolved is not None and name in self.resolved.names()

    def wake(self) -> None:
        """The first request after the idle sleep (:mod:`hydrad.engine.sleep`): load the configured model
        again, on the event loop; the request waits in the engine's queue for it as for any load. A
        load that cannot start leaves the engine model-less, with the reason as its last error."""
        core = self.core
        if core.asleep is None or core.current_load is not None or core.gen is not None:
            return
        params = self.layers.effective()
        core.asleep = None
        if params.model is None:
            core.set_stage("idle")
            return
        log_event(log, logging.INFO, "waking: loading the model the idle sleep freed", model=params.model)
        try:
            resolved = self.resolve(params.model)
            self.core.load(resolved, params, on_success=lambda: self._loaded(resolved, None),
                           kv_bytes_per_token=resolved.entry.kv_bytes_per_token if resolved.entry else None)
        except Exception as exc:
            core.record_error(f"waking from the idle sleep: {exc}")
            core.set_stage("idle")
            return
        self._loading_target = params

    def _awake(self) -> None:
        """A configure that loads or unloads a model ends the idle sleep: the engine does what it says."""
        if self.core.asleep is not None:
            self.core.asleep = None
            if self.core.current_load is None:
                self.core.set_stage("idle")


__all__ = ["EngineControl", "ConfigureResult", "ParamError", "UnknownModel", "EngineBusy"]

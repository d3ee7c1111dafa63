"""Configure semantics shared by every plane (HTTP today; the merged RPC port and the bus later).

A payload is diffed against the applied snapshot and the highest changed tier decides what
happens: T1 applies at once, T2 rebuilds the context, T3 starts a model load. The runtime
layer is committed only when the change took effect, so a failed load leaves the old
configuration in force.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hydrad.engine.core import EngineBusy, EngineCore
from hydrad.logs import log_event
from hydrad.params import ParamError, ParamLayers, RuntimeParams, Tier
from hydrad.registry import Registry, ResolvedModel, UnknownModel

log = logging.getLogger("hydrad.control")


@dataclass
class ConfigureResult:
    tier: Tier
    changed: list[str]
    load_id: int | None = None
    seconds: float | None = None

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tier": f"T{int(self.tier)}" if self.tier else "none",
                               "action": self.tier.action, "changed": self.changed}
        if self.load_id is not None:
            out["load_id"] = self.load_id
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 4)
        return out


class EngineControl:
    def __init__(self, core: EngineCore, registry: Registry, yaml_defaults: dict[str, Any]) -> None:
        self.core = core
        self.registry = registry
        self.layers = ParamLayers(yaml=dict(yaml_defaults), model_defaults=registry.defaults_for)
        self.resolved: ResolvedModel | None = None
        core.params = self.layers.effective()

    def effective(self) -> RuntimeParams:
        return self.layers.effective()

    def resolve(self, name: str) -> ResolvedModel:
        return self.registry.resolve(name)

    async def boot(self) -> ConfigureResult | None:
        """Load the YAML layer's model, if it names one (the engine is already READY by then)."""
        eff = self.layers.effective()
        if eff.model is None:
            return None
        resolved = self.resolve(eff.model)
        rec = self.core.load(resolved, eff, on_success=lambda: self._loaded(resolved, None))
        return ConfigureResult(Tier.T3, ["model"], load_id=rec.id)

    async def configure(self, payload: dict[str, Any]) -> ConfigureResult:
        """Apply a payload. Raises ParamError (400/409), UnknownModel (404) or EngineBusy (409)."""
        plan = self.layers.plan(payload)
        busy = self.core.current_load
        if busy is not None:
            # The load commits its own snapshot when it lands; a change accepted now would be lost.
            raise EngineBusy(f"load {busy.id} of {busy.model} is under way; configure again when it has finished")
        if plan.tier == Tier.NONE:
            self.layers.commit(plan)  # may drop an override equal to the value below it
            return ConfigureResult(Tier.NONE, [])
        log_event(log, logging.INFO, "configure", tier=f"T{int(plan.tier)}", changed=",".join(plan.changed))
        if plan.tier == Tier.T3:
            if plan.effective.model is None:
                await self.core.unload()
                self.resolved = None
                self.layers.commit(plan)
                return ConfigureResult(Tier.T3, plan.changed)
            resolved = self.resolve(plan.effective.model)
            rec = self.core.load(resolved, plan.effective, on_success=lambda: self._loaded(resolved, plan))
            return ConfigureResult(Tier.T3, plan.changed, load_id=rec.id)
        if plan.tier == Tier.T2:
            seconds = await self.core.rebuild_context(plan.effective)
            self.layers.commit(plan)
            return ConfigureResult(Tier.T2, plan.changed, seconds=seconds)
        self.core.set_defaults(plan.effective)
        self.layers.commit(plan)
        return ConfigureResult(Tier.T1, plan.changed)

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
            if tier == Tier.T3 and plan.effective.model is not None:
                resolved = self.resolve(plan.effective.model)
                self.layers.yaml = old_yaml  # the new YAML layer takes effect with the model

                def done() -> None:
                    self.layers.yaml = dict(defaults)
                    self._loaded(resolved, None)

                rec = self.core.load(resolved, plan.effective, on_success=done)
                return ConfigureResult(tier, changed, load_id=rec.id)
            if tier == Tier.T3:
                await self.core.unload()
                self.resolved = None
            elif tier == Tier.T2:
                await self.core.rebuild_context(plan.effective)
            else:
                self.core.set_defaults(plan.effective)
        except Exception:
            self.layers.yaml = old_yaml
            raise
        return ConfigureResult(tier, changed)

    def serves(self, name: str | None) -> bool:
        """Does a request's ``model`` field name what this engine has loaded?"""
        if name is None or name == "":
            return True
        gen = self.core.gen
        return gen is not None and name in gen.resolved.names()


__all__ = ["EngineControl", "ConfigureResult", "ParamError", "UnknownModel", "EngineBusy"]

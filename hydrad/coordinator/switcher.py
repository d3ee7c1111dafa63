"""Puts engines in the state the active profile describes, and switches profiles.

A switch computes each named engine's configure payload (``profiles.resolve``), keeps only
the engines whose payload differs from what they run (``diff_profiles``), and CONFIGUREs
those in parallel over the bus. Engines keep serving their current model while they load
the next one (the engine's own reload), so the router keeps sending them requests for the
model they still serve; nothing here stops traffic. Progress (each engine's load) is
published on the PUB socket as it arrives in heartbeats.

The same path applies the active profile to an engine that registers (a model-less engine
started by systemd gets its model from here) and loads a model on demand when routing
picks an engine that has it on disk.

A configure counts as done only once the engine's own status (heartbeat, sent just before
LOADED) reports the model ``ready``, never on the configure reply alone: a reply may come
before the model is installed (a configure that joined the engine's running load, a
configure the engine took as "nothing to change" because its layers already name the model
although no load ever installed it, a load superseded by a later configure). Trusting the
reply made the front door send GENERATE to an engine that serves nothing, get 503
``model_not_loaded`` and fail the client, again and again. So after the reply (and LOADED,
when the reply started a load) :meth:`ProfileSwitcher._until_serving` waits, bounded by
``load_timeout_s``, until a status says ``ready`` with the model, or a status heard after
the reply says the engine neither serves nor loads it: then the configure failed, with a
message saying what the engine does instead and its last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.records import EngineRecord, EngineUnreachable
from hydrad.coordinator.profiles import ProfileSet, diff_profiles, resolve
from hydrad.coordinator.state import StateFile
from hydrad.common.logs import log_event
from hydrad.common.registry import Registry

log = logging.getLogger("hydra.coordinator.profile")


class SwitchBusy(RuntimeError):
    """A profile switch is already under way."""


class LoadFailed(RuntimeError):
    """An on-demand model load did not happen (refused, failed, timed out, engine lost)."""


class ProfileSwitcher:
    def __init__(self, settings: Any, bus: CoordinatorBus, registry: Registry, profiles: ProfileSet,
                 active: str | None = None, state: StateFile | None = None) -> None:
        """``active``: the profile to start with (default: ``default_profile``, else the profiles file's
        default); ``state``: where the active profile is saved whenever a switch begins."""
        self.settings = settings
        self.bus = bus
        self.registry = registry
        self.profiles = profiles
        self.state = state
        self.active: str | None = active or settings.default_profile or profiles.default_name
        self.previous: str | None = None
        self.applied: dict[str, tuple[str, dict[str, Any]]] = {}  # engine → (instance, payload it took)
        self.configuring: dict[str, str] = {}  # engine → why (profile name, "register", "on-demand")
        self._heading: dict[str, str] = {}  # engine → the model its running configure loads
        self.switch_task: asyncio.Task[dict[str, Any]] | None = None
        self.last_switch: dict[str, Any] | None = None
        self.progress: dict[str, dict[str, Any]] = {}  # engine → latest load progress of the running switch
        self.results: dict[str, dict[str, Any]] = {}  # engine → result of the last configure we sent it (any why)
        self._ondemand: dict[str, tuple[str, asyncio.Task[dict[str, Any]]]] = {}
        self._side: set[asyncio.Task[Any]] = set()
        self._heard: dict[str, asyncio.Event] = {}  # engine → set (and replaced) whenever we hear of it
        bus.listeners.append(self._on_engine)

    # ----- payloads --------------------------------------------------------------------

    def _peer_rpc(self) -> dict[str, str]:
        return {n: r.info.rpc for n, r in self.bus.engines.items() if r.alive and r.info.rpc}

    def targets(self, name: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Engine → payload for profile ``name``, and engine → why its payload cannot be made."""
        profile = self.profiles.get(name)
        payloads: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        peers = self._peer_rpc()
        for engine, entry in profile.engines.items():
            try:
                payload = resolve(entry, self.registry.entries, peers)
            except ValueError as exc:
                errors[engine] = str(exc)
                continue
            payloads[engine] = payload
        return payloads, errors

    def current(self) -> dict[str, dict[str, Any]]:
        """What each live engine runs, as far as the coordinator knows: the payload it last took from
        us if that instance took one and still serves its model, else just the model it reports."""
        out: dict[str, dict[str, Any]] = {}
        for name, rec in self.bus.engines.items():
            if not rec.alive:
                continue
            known = self.applied.get(name)
            if known is not None and known[0] == rec.info.instance.split(".")[0] \
                    and known[1].get("model") == rec.status.model:
                out[name] = known[1]
            else:
                out[name] = {"model": rec.status.model}
        return out

    def plan(self, name: str) -> dict[str, Any]:
        """What a switch to profile ``name`` would do right now (KeyError: unknown profile).

        The same computation :meth:`_switch` runs, so the answer is the switch's own: ``payloads``
        (engine → payload) of the live engines it would CONFIGURE, ``absent`` (engines it would
        change that are not alive: they get the profile when they register), ``unchanged``
        (already matching: left alone) and ``errors`` (engine → why no payload can be made).
        """
        targets, errors = self.targets(name)
        affected = diff_profiles(self.current(), targets)
        alive = {n: p for n, p in affected.items() if (r := self.bus.engines.get(n)) is not None and r.alive}
        return {"payloads": alive, "absent": sorted(n for n in affected if n not in alive),
                "unchanged": sorted(n for n in targets if n not in affected), "errors": errors}

    def public_plan(self, name: str) -> dict[str, Any]:
        """One profile for ``GET /admin/profile``: its entries and the plan of a switch to it now."""
        profile = self.profiles.get(name)
        plan = self.plan(name)
        reload: dict[str, Any] = {}
        for engine, payload in sorted(plan["payloads"].items()):
            rec = self.bus.engines.get(engine)
            now = rec.status.model if rec is not None else None
            entry = profile.engines[engine]
            reload[engine] = {"from": now, "to": payload.get("model"), "mode": entry.mode, "peer": entry.peer,
                              "model_changes": now != payload.get("model")}
        return {"description": profile.description,
                "engines": {e: {"model": entry.model, "mode": entry.mode, "peer": entry.peer}
                            for e, entry in profile.engines.items()},
                "reload": reload, "unchanged": plan["unchanged"], "absent": plan["absent"],
                "errors": plan["errors"]}

    # ----- configuring one engine ------------------------------------------------------

    async def configure_engine(self, engine: str, payload: dict[str, Any], why: str) -> dict[str, Any]:
        """CONFIGURE one engine and wait for its load; never raises, returns a result record."""
        t0 = time.monotonic()
        self.configuring[engine] = why
        if isinstance(payload.get("model"), str):
            self._heading[engine] = payload["model"]
        result: dict[str, Any] = {"engine": engine, "model": payload.get("model"), "why": why}
        self.bus.publish("profile.engine", engine=engine, phase="configuring", why=why, model=payload.get("model"))
        try:
            reply, loaded = await self.bus.configure(engine, payload, reply_timeout=self.settings.configure_timeout_s,
                                                     load_timeout=self.settings.load_timeout_s)
            replied = time.monotonic()
            result.update(reply.result)
            model = payload.get("model")
            if not reply.ok:
                result.update(ok=False, error=reply.message, code=reply.code, status=reply.status)
            elif loaded is not None and loaded.phase == "failed":
                result.update(ok=False, load_phase=loaded.phase, load_seconds=loaded.seconds,
                              error=loaded.error or "load failed")
            elif isinstance(model, str):
                if loaded is not None:
                    result.update(load_phase=loaded.phase, load_seconds=loaded.seconds)
                    replied = time.monotonic()  # an aborted load may have been superseded by one that loads ours
                left = max(0.0, t0 + self.settings.load_timeout_s - time.monotonic())
                problem = await self._until_serving(engine, model, replied, left)
                result["ok"] = problem is None
                if problem is not None:
                    result.update(error=problem, code="not_loaded")
            elif loaded is not None:
                result.update(ok=loaded.phase == "done", load_phase=loaded.phase, load_seconds=loaded.seconds)
                if loaded.phase != "done":
                    result["error"] = loaded.error or f"load {loaded.phase}"
            else:
                result["ok"] = True
        except EngineUnreachable as exc:
            result.update(ok=False, error=str(exc), code="engine_unreachable")
        except asyncio.TimeoutError:
            result.update(ok=False, error="the engine did not finish in time (configure_timeout_s / load_timeout_s)",
                          code="timeout")
        finally:
            self.configuring.pop(engine, None)
            self._heading.pop(engine, None)
            self.progress.pop(engine, None)
        result["seconds"] = round(time.monotonic() - t0, 3)
        self.results[engine] = result  # a refused configure sets no last_error on the engine: keep it here
        if result.get("ok"):
            rec = self.bus.engines.get(engine)
            if rec is not None:
                self.applied[engine] = (rec.info.instance.split(".")[0], dict(payload))
        log_event(log, logging.INFO if result.get("ok") else logging.ERROR, "engine configured", engine=engine,
                  why=why, model=payload.get("model") or "-", ok=result.get("ok"), seconds=result["seconds"],
                  error=result.get("error") or "-")
        self.bus.publish("profile.engine", **{**result, "phase": "done" if result.get("ok") else "failed"})
        return result

    async def _until_serving(self, engine: str, model: str, since: float, timeout: float) -> str | None:
        """Wait until ``engine`` reports ``model`` ready (None), or say why it will not serve it.

        A status showing the model ``ready`` is trusted whenever it arrived (the engine sends
        one just before LOADED). The opposite verdict needs a status heard after ``since`` (the
        reply, or LOADED): an older one may predate the load the configure started. A load of
        the model still under way (joined, or a superseding configure that loads it anyway) is
        waited for. ``asyncio.TimeoutError`` after ``timeout`` seconds; ``EngineUnreachable``
        is not raised: an engine lost meanwhile is a reason like any other.
        """
        deadline = time.monotonic() + timeout
        while True:
            heard = self._heard.setdefault(engine, asyncio.Event())
            rec = self.bus.engines.get(engine)
            if rec is None or not rec.alive:
                return f"engine {engine} went away before serving {model}" + (
                    f" ({rec.down_reason})" if rec is not None and rec.down_reason else "")
            st = rec.status
            if st.stage == "ready" and _same_model(model, st.model):
                return None
            loading = st.loading_model is not None and _same_model(model, st.loading_model)
            if rec.status_at >= since and not loading and st.stage in ("ready", "idle", "failed"):
                why = (f"engine {engine} accepted the configure but does not serve {model}: it serves "
                       f"{st.model or 'nothing'} (stage {st.stage}) and is not loading {model}")
                return why + (f"; its last error: {st.last_error}" if st.last_error else "")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise asyncio.TimeoutError
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(heard.wait(), remaining)

    # ----- switching -------------------------------------------------------------------

    def start_switch(self, name: str) -> asyncio.Task[dict[str, Any]]:
        """Begin switching to profile ``name`` (KeyError: unknown; SwitchBusy: one is running)."""
        self.profiles.get(name)
        if self.switch_task is not None and not self.switch_task.done():
            raise SwitchBusy(f"a switch to {self.active!r} is under way; wait for it to finish")
        self.switch_task = asyncio.create_task(self._switch(name), name=f"profile-switch-{name}")
        return self.switch_task

    async def _switch(self, name: str) -> dict[str, Any]:
        t0 = time.monotonic()
        started = time.time()
        self.previous, self.active = self.active, name
        plan = self.plan(name)
        alive, absent, errors = plan["payloads"], plan["absent"], plan["errors"]
        if self.state is not None:
            await asyncio.to_thread(self.state.save, name)
        log_event(log, logging.INFO, "profile switch", frm=self.previous or "-", to=name,
                  engines=",".join(sorted(alive)) or "-", absent=",".join(absent) or "-")
        self.bus.publish("profile.start", profile=name, previous=self.previous, engines=sorted(alive), absent=absent,
                         errors=errors)
        results = await asyncio.gather(*(self.configure_engine(n, p, f"profile {name}") for n, p in alive.items()))
        total = round(time.monotonic() - t0, 3)
        failed = [r["engine"] for r in results if not r.get("ok")] + sorted(errors)
        out = {"profile": name, "previous": self.previous, "ok": not failed, "seconds": total, "started": started,
               "engines": {r["engine"]: r for r in results},
               "unchanged": plan["unchanged"],
               "absent": absent, "errors": errors, "failed": failed}
        self.last_switch = out
        log_event(log, logging.INFO if not failed else logging.ERROR, "profile switch done", profile=name,
                  seconds=total, ok=not failed, failed=",".join(failed) or "-")
        self.bus.publish("profile.done", profile=name, ok=not failed, seconds=total, failed=failed, absent=absent)
        return out

    @property
    def switching(self) -> bool:
        return self.switch_task is not None and not self.switch_task.done()

    # ----- engines coming and going ----------------------------------------------------

    def _on_engine(self, kind: str, rec: EngineRecord) -> None:
        heard = self._heard.pop(rec.name, None)
        if heard is not None:
            heard.set()  # wakes the configures waiting for this engine's status (_until_serving)
        if kind == "status" and rec.name in self.configuring and rec.status.progress is not None:
            p = {"stage": rec.status.stage, "progress": rec.status.progress, "model": rec.status.loading_model}
            if rec.status.fetch is not None:  # the engine fetches the model's file first: its transfer
                p["fetch"] = rec.status.fetch.text
            if self.progress.get(rec.name) != p:
                self.progress[rec.name] = p
                self.bus.publish("profile.progress", profile=self.active, engine=rec.name, **p)
        elif kind == "up" and self.active is not None and rec.name not in self.configuring \
                and rec.status.stage != "stopping":
            self._apply_on_register(rec)

    def _apply_on_register(self, rec: EngineRecord) -> None:
        """A (re)registered engine named by the active profile gets that profile's payload, unless
        this very process already took it and still serves its model."""
        try:
            targets, errors = self.targets(self.active)  # type: ignore[arg-type]
        except KeyError:
            return
        if rec.name in errors:
            log_event(log, logging.ERROR, "cannot apply the profile to a new engine", engine=rec.name,
                      profile=self.active, error=errors[rec.name])
            return
        payload = targets.get(rec.name)
        if payload is None:
            return
        if not diff_profiles({rec.name: self.current().get(rec.name, {})}, {rec.name: payload}):
            return
        t = asyncio.get_running_loop().create_task(self.configure_engine(rec.name, payload, f"register ({self.active})"))
        self._side.add(t)
        t.add_done_callback(self._side.discard)

    # ----- on-demand loads -------------------------------------------------------------

    async def ensure_model(self, engine: str, model: str) -> None:
        """Make ``engine`` serve ``model`` (routing chose it to load); LoadFailed if it does not."""
        running = self._ondemand.get(engine)
        if running is not None and not running[1].done():
            if running[0] != model:
                raise LoadFailed(f"engine {engine} is loading {running[0]} for another request")
            task = running[1]
        else:
            if engine in self.configuring:
                raise LoadFailed(f"engine {engine} is being reconfigured ({self.configuring[engine]})")
            self.bus.publish("engine.load", engine=engine, model=model, why="on-demand")
            task = asyncio.create_task(self.configure_engine(engine, {"model": model}, "on-demand"))
            self._ondemand[engine] = (model, task)
        result = await asyncio.shield(task)
        if not result.get("ok"):
            raise LoadFailed(f"engine {engine} could not load {model}: {result.get('error')}")

    def locked(self, engine: str) -> bool:
        """Being configured: routing must not pick it to load something else."""
        return engine in self.configuring

    def heading(self, engine: str) -> str | None:
        """The model a configure under way is loading on ``engine`` (None if none is): a request for
        it waits for that load, even before the engine reports the load's stage."""
        return self._heading.get(engine)

    def placed(self, engine: str) -> tuple[bool, str | None]:
        """Whether the active profile names ``engine``, and the model it gives it (None for a PEER).

        Routing's on-demand loads use this to keep the profile: an engine the profile places a
        model on may only ever be loaded with that model, and a PEER with none, so a request for
        a model whose engine died cannot evict another engine's model (nothing would put it back).
        """
        if self.active is None:
            return False, None
        try:
            entry = self.profiles.get(self.active).engines.get(engine)
        except KeyError:
            return False, None
        if entry is None:
            return False, None
        return True, entry.model

    def public(self) -> dict[str, Any]:
        targets: dict[str, Any] = {}
        if self.active is not None:
            try:
                profile = self.profiles.get(self.active)
                for name, entry in profile.engines.items():
                    rec = self.bus.engines.get(name)
                    targets[name] = {"entry": entry.model_dump(mode="json", exclude_defaults=True),
                                     "alive": bool(rec and rec.alive),
                                     "model": rec.status.model if rec else None,
                                     "stage": rec.status.stage if rec else None,
                                     "matches": bool(rec and rec.alive and rec.status.model == entry.model),
                                     "configuring": self.configuring.get(name)}
            except KeyError:
                pass
        plans: dict[str, Any] = {}
        for name in self.profiles.profiles:
            plans[name] = self.public_plan(name)
        return {"active": self.active, "previous": self.previous,
                "state": "switching" if self.switching else "steady",
                "profiles": {n: p.description for n, p in self.profiles.profiles.items()},
                "engines": targets, "progress": dict(self.progress), "last_switch": self.last_switch,
                "plans": plans}


def _same_model(wanted: str, reported: str | None) -> bool:
    """Whether an engine's reported model (its registry alias, or a file's stem) is ``wanted``
    (an alias, or a ``.gguf`` path as a profile may give it)."""
    if reported is None:
        return False
    return reported == wanted or (wanted.endswith(".gguf") and reported in (Path(wanted).stem, Path(wanted).name))

"""What routing sees of the pool: each engine's view (its REGISTER and latest heartbeat, corrected
by the requests the front door has in flight on it), the models each may load on demand, and
which engines serve which model now."""

from __future__ import annotations

from typing import Any, Callable

from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.records import EngineRecord, pairs
from hydrad.coordinator.routing import EngineView
from hydrad.coordinator.switcher import ProfileSwitcher
from hydrad.wire.stages import INCOMING_STAGES, SERVING_STAGES, SLEEPING


class PoolView:
    """Reads the bus's engine records, the switcher's placements and the affinity table; owns nothing."""

    def __init__(self, settings: Any, bus: CoordinatorBus, switcher: ProfileSwitcher, affinity: Affinity) -> None:
        self.settings, self.bus, self.switcher, self.affinity = settings, bus, switcher, affinity
        # the registry names the coordinator's model files door serves (the daemon sets it when it serves any)
        self.served_files: Callable[[], frozenset[str]] = frozenset

    def views(self, session: str | None = None, prefix: str | None = None, model: str | None = None) -> list[EngineView]:
        """What routing sees: REGISTER + latest heartbeat, corrected by the requests we have in flight
        (a heartbeat is up to an interval old; our own count is exact for bus traffic).

        Models on disk (or that the engine would fetch from here) are offered for an on-demand load
        only where the load cannot break the active profile (:meth:`_allowed`).
        """
        covered = model is not None and any(
            r.alive and model in (r.status.model, r.status.loading_model) for r in self.bus.engines.values())
        paired = pairs(self.bus.engines)
        out = []
        for rec in self.bus.engines.values():
            st, gpu = rec.status, rec.info.gpu
            vram_total, vram_free = self._pair_vram(rec, paired[rec.name].peers)
            inflight = self.bus.inflight(rec.name)
            total = st.slots_total
            heard = rec.heard_load()
            busy = max(min(heard, total), min(inflight, total))
            queued = max(heard - total, inflight - total, 0)
            model = st.model if st.model is not None or st.stage not in INCOMING_STAGES else st.loading_model
            sessions, prefixes = self.affinity.holds(rec.name, session, prefix)
            out.append(EngineView(
                name=rec.name, alive=rec.alive, stage=st.stage, model=model,
                models_on_disk=self._loadable(rec, covered), models_fetchable=self._fetchable(rec, covered),
                slots_busy=busy, slots_total=total, queued=queued, max_queue=st.max_queue,
                vram_total=vram_total, vram_free=vram_free,
                gpu_arch=gpu.arch, prefill_tps=st.prefill_tps, decode_tps=st.decode_tps, load_seconds=st.load_seconds,
                sessions=sessions, cached_prefixes=prefixes, role=st.role, kv_family=st.kv_family,
                host_weights=rec.info.host_weights))
        return out

    def _pair_vram(self, rec: EngineRecord, peers: tuple[str, ...]) -> tuple[int, int]:
        """(VRAM total, free) routing sees for the engine: its own device's, and for a COMBINE head
        its live peers' added, since a load on the head spreads over them too. A device of unknown
        size (0: a CPU, or a peer that is no registered engine) anywhere in the pair makes the
        total unknown, which routing takes as fitting."""
        def own(r: EngineRecord) -> tuple[int, int]:
            st, gpu = r.status, r.info.gpu
            return gpu.vram_total, st.vram_free if st.vram_free is not None else gpu.vram_free

        total, free = own(rec)
        for name in peers:
            peer = self.bus.engines.get(name)
            if peer is not None and (not peer.alive or name == rec.name):
                continue
            t, f = own(peer) if peer is not None else (0, 0)
            if total <= 0 or t <= 0:
                return 0, 0
            total, free = total + t, free + f
        return total, free

    def _allowed(self, rec: EngineRecord, covered: bool) -> frozenset[str] | None:
        """The models routing may load on demand on this engine (None: any it has or can fetch).

        - an engine the active profile places a model on: that model only, and only while it
          serves nothing (it is model-less, e.g. restarted and not configured yet). Loading
          another model there would evict the profile's, and nothing would restore it: a request
          for a dead engine's model would move that model onto a healthy engine and leave the
          healthy engine's own model served nowhere;
        - a PEER of the profile: nothing (its device is lent to a COMBINE head);
        - an engine the profile leaves free: anything while it serves nothing, or while no live
          engine serves, loads or sleeps with the requested model at all (``covered``), so a
          burst for one model does not replace another that is served;
        - nothing while the engine is being configured, or when loading on demand is off.
        """
        st = rec.status
        if not self.settings.load_on_demand or self.switcher.locked(rec.name):
            return frozenset()
        placed, model = self.switcher.placed(rec.name)
        if placed:
            return frozenset({model}) if model is not None and st.stage == "idle" else frozenset()
        if st.stage == "idle" or (st.stage in ("ready", SLEEPING) and not covered):
            return None
        return frozenset()

    def _loadable(self, rec: EngineRecord, covered: bool) -> frozenset[str]:
        """The models on the engine's disk routing may load there on demand (:meth:`_allowed`)."""
        allowed, on_disk = self._allowed(rec, covered), frozenset(rec.info.models_on_disk)
        return on_disk if allowed is None else on_disk & allowed

    def _fetchable(self, rec: EngineRecord, covered: bool) -> frozenset[str]:
        """The models routing may load on demand on the engine after it fetches the file from this
        coordinator: ones the engine says it would fetch and this coordinator's files door serves,
        under the same rules (:meth:`_allowed`). Routing charges the transfer."""
        if not rec.info.models_fetchable:
            return frozenset()
        wanted = frozenset(rec.info.models_fetchable) & self.served_files()
        allowed = self._allowed(rec, covered) if wanted else frozenset()
        return wanted if allowed is None else wanted & allowed

    def served(self) -> dict[str, list[str]]:
        """Model → engines serving it now (alive, in a serving stage)."""
        out: dict[str, list[str]] = {}
        for rec in self.bus.engines.values():
            if rec.alive and rec.status.model and rec.status.stage in SERVING_STAGES:
                out.setdefault(rec.status.model, []).append(rec.name)
        return out

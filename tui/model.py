"""The console's model of the pool, built from admin snapshots and PUB events (no I/O, no text here).

Two sources feed one :class:`PoolModel`:

- ``GET /admin/engines`` and ``GET /admin/profile`` (a full snapshot, fetched at start, on ``r``
  and every few seconds): the only source of heartbeat figures (slots, queue, tok/s, VRAM);
- events from the coordinator's PUB socket (``engine.up/down/stage/progress/load``, ``route``,
  ``profile.*``): stage changes, load progress, deaths and routing decisions as they happen.

Everything is plain data so the widgets only render and the unit tests need no terminal; turning
it into text is ``tui/format.py``'s job.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hydrad.wire.stages import LOADING_STAGES

ROUTE_LOG_SIZE = 200
RECENT_EVENTS = 100  # per engine, for its detail screen
SESSIONS_KEPT = 32  # per engine, the sessions last routed to it
# what GET /admin/engines sets on a row; the EVENT_FIELDS among them are also set by events
SNAPSHOT_FIELDS = ("alive", "down_reason", "stage", "model", "loading_model", "generation", "mode", "role", "peers",
                   "serving", "pair_peers", "pair_heads", "progress", "slots_busy", "slots_total", "queued",
                   "max_queue", "n_ctx", "prefill_tps", "decode_tps", "load_seconds", "vram_free", "last_error", "inflight", "sessions", "configuring", "http", "rpc",
                   "version", "pid", "up_since")
EVENT_FIELDS = frozenset({"alive", "down_reason", "stage", "model", "loading_model", "progress", "configuring"})


@dataclass
class EngineRow:
    """One engine as the console shows it."""

    name: str
    alive: bool = True
    down_reason: str | None = None
    gpu: dict[str, Any] = field(default_factory=dict)
    stage: str = "starting"
    model: str | None = None
    loading_model: str | None = None
    generation: str | None = None
    mode: str = "solo"  # what the engine reports: solo | combine
    role: str = "solo"  # solo | head | peer | head+peer, as the engine reports it
    peers: list[str] = field(default_factory=list)  # a head's peers' RPC endpoints
    serving: list[str] = field(default_factory=list)  # a peer's heads' client addresses
    pair_peers: list[str] | None = None  # a head's peers by engine name (the coordinator's; None: not given)
    pair_heads: list[str] | None = None  # a peer's heads by engine name
    progress: float | None = None
    fetch: str | None = None  # "fetching 37%, 120 MB/s, ETA 12 s" while the engine fetches the model's file
    slots_busy: int = 0
    slots_total: int = 0
    queued: int = 0
    max_queue: int = 0
    n_ctx: int = 0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    load_seconds: float | None = None
    vram_free: int | None = None
    last_error: str | None = None
    inflight: int = 0
    sessions: int = 0
    configuring: str | None = None
    http: str | None = None
    rpc: str | None = None
    version: str | None = None
    pid: int | None = None
    up_since: float | None = None
    models_on_disk: list[str] = field(default_factory=list)
    last_configure: dict[str, Any] | None = None  # the coordinator's last configure of it, when it reports one
    last_seen: float | None = None  # clock() of the last sign of life we know of
    # the load under way, as the console saw it (clock() times): when it began, its first and latest
    # progress samples (the ETA is the rate between the two)
    load_started: float | None = None
    load_first: tuple[float, float] | None = None  # (clock, progress)
    load_last: tuple[float, float] | None = None

    @property
    def loading(self) -> bool:
        """A load is under way (first load, warm-up or a reload while the old model serves)."""
        return self.alive and self.stage in LOADING_STAGES

    @property
    def in_load(self) -> bool:
        """Loading, or being configured by the coordinator (a load is about to start)."""
        return self.alive and (self.stage in LOADING_STAGES or bool(self.configuring))

    @property
    def phase(self) -> str:
        """The load's phase: the engine's stage while it loads, ``configuring`` before that."""
        if self.stage in LOADING_STAGES or not self.configuring:
            return self.stage
        return "configuring"

    @property
    def vram_total(self) -> int:
        return int(self.gpu.get("vram_total") or 0)

    @property
    def vram_used(self) -> int | None:
        total = self.vram_total
        if not total:
            return None
        free = self.vram_free if self.vram_free is not None else self.gpu.get("vram_free")
        return None if free is None else max(0, total - int(free))


@dataclass(frozen=True)
class RouteEntry:
    """One routing decision from a ``route`` event."""

    ts: float
    req: str
    engine: str | None
    model: str | None
    step: str
    reason: str
    attempt: int = 1
    session: str | None = None
    candidates: int = 0
    rejected: int = 0


@dataclass
class ProfileInfo:
    active: str | None = None
    previous: str | None = None
    state: str = "steady"  # steady | switching
    profiles: dict[str, str] = field(default_factory=dict)  # name → description
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # engine → its entry in the active profile
    # profile → its entries and what a switch to it would do now (GET /admin/profile "plans"; empty
    # from a coordinator that does not publish them)
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    switching_to: str | None = None
    switch_engines: list[str] = field(default_factory=list)
    switch_started: float | None = None  # clock() when the console learnt of the running switch
    switch_done: dict[str, dict[str, Any]] = field(default_factory=dict)  # engine → {ok, error, seconds}
    switch_errors: dict[str, str] = field(default_factory=dict)  # engine → why the switch has no payload for it
    last_switch: dict[str, Any] | None = None

    def progress(self) -> tuple[int, int]:
        """(engines finished, engines the running switch reloads)."""
        total = len(self.switch_engines)
        return min(total, sum(1 for e in self.switch_done if e in self.switch_engines)), total


def switch_reasons(last: dict[str, Any] | None) -> dict[str, str]:
    """Engine → why it failed, from a switch result (``last_switch`` of the admin API or the console's own)."""
    if not last:
        return {}
    out: dict[str, str] = {}
    reasons = last.get("reasons")
    if isinstance(reasons, dict):
        out.update({str(k): str(v) for k, v in reasons.items()})
    engines = last.get("engines")
    if isinstance(engines, dict):
        for name, res in engines.items():
            if isinstance(res, dict) and res.get("ok") is False:
                out.setdefault(str(name), str(res.get("error") or "failed"))
    errors = last.get("errors")
    if isinstance(errors, dict):
        for name, why in errors.items():
            out.setdefault(str(name), str(why))
    for name in last.get("failed") or []:
        out.setdefault(str(name), "failed")
    return out


class PoolModel:
    """Engines, profiles and recent routing decisions; ``apply_*`` return what changed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, route_log_size: int = ROUTE_LOG_SIZE) -> None:
        self.clock = clock
        self.engines: dict[str, EngineRow] = {}
        self.profile = ProfileInfo()
        self.routes: deque[RouteEntry] = deque(maxlen=route_log_size)
        self.events_seen = 0
        self.seq = 0  # events applied so far; a snapshot request notes it (see apply_engines)
        self._event_seq: dict[str, int] = {}  # engine → seq of its latest event
        self._profile_seq = -1  # seq of the latest profile.start / profile.done
        self.recent: dict[str, deque[tuple[float, str]]] = {}  # engine → its latest events (time, line)
        self.sessions_seen: dict[str, dict[str, float]] = {}  # engine → session → time of its latest route there

    def note(self, engine: str, ts: float, text: str) -> None:
        """Remember one event line for the engine's detail screen."""
        log = self.recent.get(engine)
        if log is None:
            log = self.recent[engine] = deque(maxlen=RECENT_EVENTS)
        log.append((ts, text))

    # ----- admin snapshots ---------------------------------------------------------------

    def apply_engines(self, doc: dict[str, Any], since: int | None = None) -> set[str]:
        """``GET /admin/engines``: replaces every engine's figures (engines gone from it are dropped).

        ``since`` is :attr:`seq` when the request was sent: an engine with events after that keeps
        what the events said about its liveness, stage, model and load (the snapshot may predate
        them; the console asks again after such events, so a stale event is corrected next time).
        """
        now = self.clock()
        seen: set[str] = set()
        for item in doc.get("engines") or []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue
            name = item["name"]
            seen.add(name)
            row = self.engines.get(name) or EngineRow(name)
            newer = since is not None and self._event_seq.get(name, -1) > since
            for key in SNAPSHOT_FIELDS:
                if key in item and not (newer and key in EVENT_FIELDS):
                    setattr(row, key, item[key])
            if not (newer and "progress" in EVENT_FIELDS):
                fetch = item.get("fetch")
                row.fetch = str(fetch["text"]) if isinstance(fetch, dict) and fetch.get("text") else None
            if isinstance(item.get("gpu"), dict):
                row.gpu = dict(item["gpu"])
            if isinstance(item.get("last_configure"), dict) or item.get("last_configure", 0) is None:
                row.last_configure = item.get("last_configure")
            if isinstance(item.get("models_on_disk"), list):
                row.models_on_disk = [str(m) for m in item["models_on_disk"]]
            age = item.get("last_seen_s")
            if isinstance(age, (int, float)):
                row.last_seen = now - float(age)
            row.mode = str(row.mode or "solo")
            row.role = str(row.role or "solo")
            for key in ("peers", "serving"):
                value = getattr(row, key)
                setattr(row, key, [str(v) for v in value] if isinstance(value, list) else [])
            for key in ("pair_peers", "pair_heads"):
                value = getattr(row, key)
                setattr(row, key, [str(v) for v in value] if isinstance(value, list) else None)
            self._track_load(row, now)
            self.engines[name] = row
        for name in list(self.engines):
            if name not in seen and not (since is not None and self._event_seq.get(name, -1) > since):
                del self.engines[name]
                self._event_seq.pop(name, None)
        if isinstance(doc.get("profile"), str):
            self.profile.active = doc["profile"]
        return {"engines", "profile"}

    def apply_profile(self, doc: dict[str, Any], since: int | None = None) -> set[str]:
        """``GET /admin/profile``: profile names, the active one, its per-engine entries, the last switch.

        ``since`` as for :meth:`apply_engines`: after a newer ``profile.start``/``profile.done``
        event, what the events said about the switch (active profile, state, progress) stands."""
        p = self.profile
        newer = since is not None and self._profile_seq > since
        if not newer:
            p.active = doc.get("active")
            p.previous = doc.get("previous")
            p.state = doc.get("state") or "steady"
        if isinstance(doc.get("profiles"), dict):
            p.profiles = {str(k): str(v or "") for k, v in doc["profiles"].items()}
        entries: dict[str, dict[str, Any]] = {}
        for name, target in (doc.get("engines") or {}).items():
            if isinstance(target, dict) and isinstance(target.get("entry"), dict):
                entries[str(name)] = target["entry"]
        p.entries = entries
        if isinstance(doc.get("plans"), dict):
            p.plans = {str(k): v for k, v in doc["plans"].items() if isinstance(v, dict)}
        last = doc.get("last_switch")
        if not newer and (isinstance(last, dict) or last is None):
            p.last_switch = last  # with every engine's result (switch_reasons reads the failures)
        now = self.clock()
        if p.state != "switching":
            last = p.last_switch
            if p.switching_to and isinstance(last, dict) and last.get("profile") == p.switching_to \
                    and isinstance(last.get("engines"), dict):
                # the switch ended before its last events got here: each engine's result from the answer
                for name, res in last["engines"].items():
                    if isinstance(res, dict):
                        p.switch_done.setdefault(str(name), {"ok": bool(res.get("ok")), "error": res.get("error"),
                                                             "seconds": res.get("seconds")})
            p.switching_to, p.switch_engines, p.switch_started = None, [], None
        else:
            p.switching_to = p.switching_to or p.active
            if not p.switch_engines:  # the console started during a switch: the engines being configured for it
                p.switch_engines = sorted(n for n, t in (doc.get("engines") or {}).items()
                                          if isinstance(t, dict) and t.get("configuring"))
            if p.switch_started is None:
                p.switch_started = now
        for name, prog in (doc.get("progress") or {}).items():
            row = self.engines.get(name)
            if since is not None and self._event_seq.get(name, -1) > since:
                continue  # an event since the request said more recent things about this load
            if row is not None and isinstance(prog, dict) and prog.get("progress") is not None:
                row.progress = fraction(prog["progress"])
                self._track_load(row, now)
        return {"profile", "engines"}

    # ----- events ------------------------------------------------------------------------

    def apply_event(self, topic: str, data: dict[str, Any], ts: float | None = None) -> set[str]:
        """One PUB event; unknown topics and odd payloads are ignored (a newer coordinator may send more)."""
        self.events_seen += 1
        self.seq += 1
        now = self.clock()
        name = data.get("engine") if isinstance(data.get("engine"), str) else None
        if name is not None and topic != "route":
            self._event_seq[name] = self.seq
        if topic == "route":
            self.routes.append(RouteEntry(
                ts=ts if ts is not None else time.time(), req=str(data.get("req") or "-"), engine=name,
                model=data.get("model"), step=str(data.get("step") or "-"), reason=str(data.get("reason") or ""),
                attempt=int(data.get("attempt") or 1), session=data.get("session"),
                candidates=len(data.get("candidates") or ()), rejected=len(data.get("rejected") or {})))
            session = data.get("session")
            if name is not None and isinstance(session, str) and session:
                seen = self.sessions_seen.setdefault(name, {})
                seen.pop(session, None)
                seen[session] = ts if ts is not None else time.time()
                while len(seen) > SESSIONS_KEPT:
                    seen.pop(next(iter(seen)))
            return {"routes"}
        if topic.startswith("profile."):
            return self._profile_event(topic, data, name, now)
        if name is None:
            return set()
        row = self.engines.get(name)
        if row is None:
            row = self.engines[name] = EngineRow(name)
        if topic == "engine.up":
            row.alive, row.down_reason = True, None
            if isinstance(data.get("gpu"), dict):
                row.gpu = dict(data["gpu"])
            row.stage = data.get("stage") or row.stage
            row.model = data.get("model")
            row.http = data.get("http") or row.http
            row.rpc = data.get("rpc") or row.rpc
            row.last_seen = now
        elif topic == "engine.down":
            row.alive = False
            row.down_reason = data.get("reason") or "down"
            row.progress = None
            row.fetch = None
        elif topic == "engine.stage":
            row.stage = data.get("stage") or row.stage
            row.model = data.get("model")
            row.loading_model = data.get("loading_model")
            if row.stage not in LOADING_STAGES:
                row.progress = None
                row.fetch = None
            row.last_seen = now  # published when a heartbeat arrives
        elif topic == "engine.progress":
            row.stage = data.get("stage") or row.stage
            row.progress = fraction(data.get("progress"))
            row.fetch = data.get("fetch") if isinstance(data.get("fetch"), str) else None
            row.loading_model = data.get("loading_model") or row.loading_model
            row.last_seen = now
        elif topic == "engine.load":
            row.loading_model = data.get("model") or row.loading_model
            row.configuring = data.get("why") or "on-demand"
        else:
            return set()
        self._track_load(row, now)
        return {"engines"}

    def _profile_event(self, topic: str, data: dict[str, Any], name: str | None, now: float) -> set[str]:
        p = self.profile
        if topic in ("profile.start", "profile.done"):
            self._profile_seq = self.seq
        if topic == "profile.start":
            p.previous, p.active = data.get("previous"), data.get("profile")
            p.state, p.switching_to = "switching", data.get("profile")
            p.switch_engines = [str(e) for e in data.get("engines") or []]
            p.switch_started, p.switch_done = now, {}
            errors = data.get("errors")
            p.switch_errors = {str(k): str(v) for k, v in errors.items()} if isinstance(errors, dict) else {}
            return {"profile", "engines"}
        if topic == "profile.done":
            last = {k: data.get(k) for k in ("profile", "ok", "seconds", "failed", "absent")}
            reasons = {e: str(r.get("error") or "failed") for e, r in p.switch_done.items() if not r.get("ok")}
            last["reasons"] = {**p.switch_errors, **reasons}
            p.last_switch = last
            p.state, p.switching_to, p.switch_engines, p.switch_started = "steady", None, [], None
            return {"profile", "engines"}
        if name is None:
            return set()
        row = self.engines.get(name)
        if row is None:
            return set()
        if topic == "profile.progress":
            row.stage = data.get("stage") or row.stage
            row.progress = fraction(data.get("progress"))
            row.loading_model = data.get("model") or row.loading_model
            row.last_seen = now
        elif topic == "profile.engine":
            phase = data.get("phase")
            if phase == "configuring":
                row.configuring = data.get("why") or "profile"
                row.loading_model = data.get("model") or row.loading_model
            else:
                row.configuring = None
                if phase == "failed":
                    row.last_error = data.get("error") or row.last_error
                p = self.profile
                if p.state == "switching" and name in p.switch_engines and phase in ("done", "failed"):
                    p.switch_done[name] = {"ok": phase == "done", "error": data.get("error"),
                                                      "seconds": data.get("seconds")}
        else:
            return set()
        self._track_load(row, now)
        return {"engines", "profile"}

    def _track_load(self, row: EngineRow, now: float) -> None:
        """Start, sample or forget the row's load timing (for elapsed time and ETA)."""
        if not row.in_load:
            row.load_started = row.load_first = row.load_last = None
            return
        if row.load_started is None:
            row.load_started = now
        p = row.progress
        if p is None:
            return
        if row.load_last is not None and p == row.load_last[1]:
            return  # no news: the rate is measured from when the value was first seen
        if row.load_first is None or p < row.load_first[1] or (row.load_last is not None and p < row.load_last[1]):
            row.load_first = (now, p)  # a new load (or a restarted one): measure the rate from here
        row.load_last = (now, p)

    # ----- views -------------------------------------------------------------------------

    def sorted_engines(self) -> list[EngineRow]:
        return [self.engines[n] for n in sorted(self.engines)]

    def heartbeat_age(self, row: EngineRow) -> float | None:
        return None if row.last_seen is None else max(0.0, self.clock() - row.last_seen)

    def mode_label(self, row: EngineRow) -> str:
        """What the engine reports it is, with its pair: ``SOLO``, ``COMBINE head→p100``, ``COMBINE
        peer←5060ti``; while a running profile switch still has to make it something else, the
        target after an arrow (``SOLO → COMBINE``). Never the profile's intent alone."""
        now = reported_mode(row)
        target = self.switch_target(row)
        return f"{now} → {target}" if target else now

    def switch_target(self, row: EngineRow) -> str | None:
        """The mode (SOLO, COMBINE, PEER) the running switch gives the engine, when the engine does
        not report it yet and the switch has not finished with it; else None."""
        p = self.profile
        if p.state != "switching" or row.name not in p.switch_engines or row.name in p.switch_done:
            return None
        plan = p.plans.get(p.switching_to or "") or {}
        entries = plan.get("engines") if isinstance(plan.get("engines"), dict) else None
        if entries is None and p.switching_to == p.active:
            entries = p.entries
        entry = (entries or {}).get(row.name)
        if not isinstance(entry, dict):
            return None
        mode = str(entry.get("mode") or "SOLO").upper()
        roles = row.role.split("+")
        if mode == "COMBINE":
            peer = entry.get("peer")
            named = row.pair_peers if row.pair_peers is not None else row.peers
            done = "head" in roles and (not peer or peer in named)
            return None if done else (f"COMBINE+{peer}" if peer else "COMBINE")
        if mode == "PEER":
            return None if "peer" in roles else "PEER"
        return None if row.role == "solo" else "SOLO"

    def load_elapsed(self, row: EngineRow) -> float | None:
        return None if row.load_started is None else max(0.0, self.clock() - row.load_started)

    def load_eta(self, row: EngineRow) -> float | None:
        """Seconds left in the row's load at the rate seen so far; None until two samples differ."""
        first, last = row.load_first, row.load_last
        if first is None or last is None:
            return None
        if last[1] >= 1.0:
            return 0.0
        dt, dp = last[0] - first[0], last[1] - first[1]
        if dt <= 0 or dp <= 0:
            return None
        return max(0.0, (1.0 - last[1]) * dt / dp - (self.clock() - last[0]))

    def switch_elapsed(self) -> float | None:
        started = self.profile.switch_started
        return None if started is None else max(0.0, self.clock() - started)

    def reload_estimate(self, profile: str) -> tuple[list[str], bool]:
        """Live engines a switch to ``profile`` would reload, and whether that list is exact.

        Exact from the coordinator's plan (``GET /admin/profile`` "plans": the switch's own
        computation). From a coordinator without plans: re-applying the active profile reloads
        the engines that do not serve their entry's model (exact); for another profile every live
        engine is counted (an upper bound: the coordinator skips engines already matching it).
        """
        plan = self.profile.plans.get(profile)
        if plan is not None and isinstance(plan.get("reload"), dict):
            return sorted(plan["reload"]), True
        live = [r for r in self.sorted_engines() if r.alive]
        if profile == self.profile.active and self.profile.entries:
            return [r.name for r in live if r.name in self.profile.entries
                    and self.profile.entries[r.name].get("model") != r.model], True
        return [r.name for r in live], False


def reported_mode(row: EngineRow) -> str:
    """``SOLO``, or ``COMBINE`` with the role the engine reports and its pair, by engine name where
    the coordinator knows it (else the addresses the engine reports): ``COMBINE head→p100``,
    ``COMBINE peer←5060ti``, ``COMBINE head→a peer←b``."""
    roles = row.role.split("+")
    parts = []
    if "head" in roles:
        peers = row.pair_peers if row.pair_peers is not None else row.peers
        parts.append("head→" + (",".join(peers) or "?"))
    if "peer" in roles:
        heads = row.pair_heads if row.pair_heads is not None else row.serving
        parts.append("peer←" + (",".join(heads) or "?"))
    mode = row.mode.upper()
    return f"{mode} {' '.join(parts)}" if parts else mode


def fraction(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return min(1.0, max(0.0, float(v)))
    return None


# ----- formatting ------------------------------------------------------------------------


def summarize(engines: Iterable[EngineRow]) -> tuple[int, int, int]:
    """(alive, dead, loading)."""
    alive = dead = loading = 0
    for r in engines:
        if r.alive:
            alive += 1
            loading += r.loading
        else:
            dead += 1
    return alive, dead, loading

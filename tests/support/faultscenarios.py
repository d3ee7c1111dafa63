"""The reliability program's scenarios: faults and floods against a real :class:`FaultPool`.

Each scenario measures, checks its figures against the goal the issue set, and returns a
:class:`Result`; none raises for a broken promise (that is a failed result with its reason), so one
run reports every scenario. Every wait is bounded, and after each scenario the pool is healed (dead
daemons restarted, both engines serving) so the next one starts from a whole pool."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from hydrad.store import Store
from tests.support.engine import REPO
from tests.support.faultpool import ENGINES, HEARTBEAT_S, LIVENESS, MODEL, FaultPool, wait_for
from tests.support.netpartition import NetLink, PartitionUnavailable
from tests.support.procstat import Sampler
from tests.support.streamcheck import COMPLETE, DROPPED, ERROR, HANG, Outcome, chat_once, stream_chat


@dataclass
class Result:
    name: str
    goal: str
    passed: bool = True
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, why: str) -> None:
        self.passed = False
        if len(self.failures) < 20:
            self.failures.append(why)


def p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[max(0, math.ceil(0.99 * len(s)) - 1)], 3)


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    return {"n": len(s), "median": round(s[len(s) // 2], 2), "max": round(s[-1], 2)}


def story_body(i: int, max_tokens: int = 48) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Story {i}: tell me a long story about a lighthouse."}]}


def long_prompt(i: int) -> str:
    """About 1,500 tokens, different for each ``i`` from its first word (no cached prefix anywhere)."""
    return f"Run {i}. " + " ".join(f"item {i}-{k} is number {k}." for k in range(180))


def heal(pool: FaultPool, timeout: float = 120.0) -> None:
    """Restart whatever is dead or frozen, then wait until both engines serve again."""
    for d in [pool.coordinator, *pool.engines.values()]:
        d.signal(signal.SIGCONT)  # a scenario interrupted mid-freeze must not leave a process stopped
    if not pool.coordinator.alive():
        pool.coordinator.start()
        pool.wait_coordinator(60)
    for d in pool.engines.values():
        if not d.alive():
            d.start()
    pool.wait_pool(timeout)


def _coordinator_crashed(pool: FaultPool, res: Result) -> bool:
    if pool.coordinator.alive():
        return False
    res.fail(f"the coordinator exited by itself: {pool.coordinator.log_tail(1500)}")
    res.figures["coordinator_crashes"] = res.figures.get("coordinator_crashes", 0) + 1
    pool.coordinator.start()
    pool.wait_coordinator(60)
    return True


# ----- kill -9 an engine mid-stream ---------------------------------------------------------------

def engine_kills(pool: FaultPool, n: int, seed: int = 1, budget: float = 60.0,
                 log: Callable[[str], None] = lambda _: None) -> Result:
    """``n`` times: two streams at once through the front door; the engine serving the first is killed
    with SIGKILL, after its k-th token (k = 1..8) or, every fourth time, before its first token (mid
    prefill of a long prompt: the coordinator must retry it elsewhere). The script restarts the engine
    (systemd's Restart=) and waits for the pool to serve the profile again."""
    res = Result("engine kill -9 mid-stream",
                 f"{n} kills: every client gets a complete answer or a clean error (no hang, no garbled stream); "
                 "the coordinator never crashes; the engine restarted and the profile back every time")
    rng = random.Random(seed)
    victims: Counter[str] = Counter()
    killed_kinds: Counter[str] = Counter()
    bystander_kinds: Counter[str] = Counter()
    retried_complete = pre_token_kills = 0
    back_s: list[float] = []
    t_start = time.monotonic()
    for i in range(n):
        pre = i % 4 == 3
        killed: dict[str, str] = {}
        before = pool.instances()

        def kill(engine: str | None) -> None:
            if engine and not killed and engine in pool.engines:
                killed["engine"] = engine
                pool.engines[engine].kill9()

        bystander: dict[str, Outcome] = {}
        by = None
        if pre:
            body = {"model": MODEL, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": long_prompt(i) + " Which item is number 7?"}]}
            out_box: dict[str, Outcome] = {}
            t = threading.Thread(target=lambda: out_box.setdefault("o", stream_chat(pool.url, body, budget)), daemon=True)
            t.start()

            def busy() -> str | None:
                for name, e in pool.engines_view().items():
                    if e.get("inflight") and "o" not in out_box:
                        return name
                return None
            try:
                victim, _ = wait_for("a request in flight", busy, 30, 0.01)
                kill(victim)
                pre_token_kills += 1
            except TimeoutError:
                pass
            t.join(budget + 5)
            out = out_box.get("o") or Outcome(kind=HANG, detail="the client thread never returned")
        else:
            k = rng.randint(1, 8)
            by = threading.Thread(target=lambda: bystander.setdefault("o", stream_chat(pool.url, story_body(10_000 + i, 32), budget)),
                                  daemon=True)
            by.start()
            out = stream_chat(pool.url, story_body(i), budget, on_chunk=lambda m, eng: kill(eng) if m == k else None)
            by.join(budget + 5)
            b = bystander.get("o") or Outcome(kind=HANG, detail="the client thread never returned")
            bystander_kinds[b.kind] += 1
            if not b.ok:
                res.fail(f"kill {i + 1}: the other stream: {b.kind} {b.detail}")
        killed_kinds[out.kind] += 1
        if out.kind == COMPLETE and pre and killed:
            retried_complete += 1
        if not out.ok:
            res.fail(f"kill {i + 1}: the killed stream: {out.kind} {out.detail} (engine {out.engine})")
        _coordinator_crashed(pool, res)
        victim = killed.get("engine")
        if victim is None:
            log(f"kill {i + 1}/{n}: nothing killed (the answer ended first: {out.kind})")
            continue
        victims[victim] += 1
        t0 = time.monotonic()
        pool.engines[victim].start()
        try:
            pool.wait_pool(120, not_instances={victim: before[victim]})
            back_s.append(time.monotonic() - t0)
        except (TimeoutError, RuntimeError) as exc:
            res.fail(f"kill {i + 1}: the pool did not come back: {exc}")
            heal(pool)
        log(f"kill {i + 1}/{n}: {victim} after {'prefill' if pre else 'token'}: client {out.kind}"
            f"{' (' + str(out.error_code) + ': ' + out.detail + ')' if out.error_code else ''}, "
            f"pool back in {time.monotonic() - t0:.1f}s")
    kills = sum(victims.values())
    all_kinds = killed_kinds + bystander_kinds
    res.figures = {"kills": kills, "asked": n, "killed_before_first_token": pre_token_kills,
                   "retried_and_complete": retried_complete, "killed_stream": dict(killed_kinds),
                   "other_stream": dict(bystander_kinds), "hangs": all_kinds[HANG],
                   "garbled": all_kinds["garbled"] + all_kinds[DROPPED],
                   "coordinator_crashes": res.figures.get("coordinator_crashes", 0),
                   "pool_back": len(back_s), "pool_back_s": _stats(back_s)}
    if kills < n * 0.9:
        res.fail(f"only {kills} of {n} kills landed")
    if len(back_s) != kills:
        res.fail(f"the pool came back {len(back_s)} times after {kills} kills")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


# ----- kill -9 the coordinator mid-stream ----------------------------------------------------------

def coordinator_kills(pool: FaultPool, rounds: int, budget: float = 60.0,
                      log: Callable[[str], None] = lambda _: None) -> Result:
    res = Result("coordinator kill -9 mid-stream",
                 "the client's stream ends (no hang); both engines keep serving their own doors; a new "
                 "coordinator sees both re-registered (goal: within 10 s)")
    reg_s: list[float] = []
    client: Counter[str] = Counter()
    own_door: Counter[int] = Counter()
    t_start = time.monotonic()
    for r in range(rounds):
        out = stream_chat(pool.url, story_body(20_000 + r, 200), budget,
                          on_chunk=lambda m, _e: pool.coordinator.kill9() if m == 3 else None)
        client[out.kind] += 1
        if out.kind == HANG:
            res.fail(f"round {r + 1}: the client hung: {out.detail}")
        for name, url in pool.engine_http.items():
            status, _ = chat_once(url, {"model": MODEL, "max_tokens": 4, "temperature": 0,
                                        "messages": [{"role": "user", "content": "hi"}]}, 30)
            own_door[status] += 1
            if status != 200:
                res.fail(f"round {r + 1}: {name}'s own door answered {status} while the coordinator was down")
        t0 = time.monotonic()
        pool.coordinator.start()
        try:
            pool.wait_coordinator(60)
            wait_for("both engines re-registered", lambda: all(e["alive"] for e in pool.engines_view().values())
                     and len(pool.engines_view()) == len(ENGINES), 60, 0.02)
            reg_s.append(time.monotonic() - t0)
            pool.wait_pool(60)
            status, _ = chat_once(pool.url, {"model": MODEL, "max_tokens": 4, "temperature": 0,
                                             "messages": [{"role": "user", "content": "hi"}]}, 30)
            if status != 200:
                res.fail(f"round {r + 1}: the new coordinator answered {status}")
        except (TimeoutError, RuntimeError) as exc:
            res.fail(f"round {r + 1}: {exc}")
            heal(pool)
        log(f"coordinator kill {r + 1}/{rounds}: client {out.kind}, re-registered in {time.monotonic() - t0:.1f}s")
    res.figures = {"kills": rounds, "client": dict(client), "own_door_status": dict(own_door),
                   "reregistered_s": _stats(reg_s)}
    if reg_s and max(reg_s) > 10:
        res.fail(f"re-registration took {max(reg_s):.1f}s")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


# ----- SIGSTOP an engine past the heartbeat timeout -----------------------------------------------

def _outage(pool: FaultPool, res: Result, label: str, victim: str, other: str, seconds: float,
            begin: Callable[[], None], end: Callable[[], None], served: Counter[str],
            dead_s: list[float], back_s: list[float]) -> bool:
    """One outage of ``victim`` (``begin`` .. ``end``, ``seconds`` long): the time until it is marked
    dead, requests meanwhile (each must be served by ``other``), the time until it is back after
    ``end``. False when it was not re-admitted."""
    t0 = time.monotonic()
    begin()
    try:
        dead_s.append(pool.wait_dead(victim, 15))
        while time.monotonic() - t0 < seconds:
            r_ = httpx.post(pool.url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]})
            eng = r_.headers.get("x-hydra-engine")
            served[f"{r_.status_code} by {'the other' if eng == other else eng}"] += 1
            if r_.status_code != 200 or eng != other:
                res.fail(f"{label}: a request during the outage of {victim}: {r_.status_code} from {eng}")
    except (TimeoutError, httpx.HTTPError) as exc:
        res.fail(f"{label}: {exc}")
    finally:
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        end()
    try:
        back_s.append(pool.wait_alive(victim, 30))
        pool.wait_pool(60)
        return True
    except (TimeoutError, RuntimeError) as exc:
        res.fail(f"{label}: not re-admitted: {exc}")
        return False


def _last(xs: list[float]) -> float:
    return xs[-1] if xs else float("nan")


def engine_freezes(pool: FaultPool, rounds: int, frozen_s: float = 5.0,
                   log: Callable[[str], None] = lambda _: None) -> Result:
    limit = HEARTBEAT_S * LIVENESS
    res = Result("engine SIGSTOP past the heartbeat timeout",
                 f"marked dead within the timeout ({limit:.1f} s) + 1 s; every request meanwhile served by the other "
                 "engine; re-admitted after SIGCONT (goal: within 10 s)")
    dead_s: list[float] = []
    back_s: list[float] = []
    served: Counter[str] = Counter()
    t_start = time.monotonic()
    for r in range(rounds):
        victim, other = ENGINES[r % 2], ENGINES[(r + 1) % 2]
        d = pool.engines[victim]
        if not _outage(pool, res, f"round {r + 1}", victim, other, frozen_s, lambda: d.signal(signal.SIGSTOP),
                       lambda: d.signal(signal.SIGCONT), served, dead_s, back_s):
            heal(pool)
        _coordinator_crashed(pool, res)
        log(f"freeze {r + 1}/{rounds}: {victim} dead after {_last(dead_s):.2f}s, back {_last(back_s):.2f}s after SIGCONT")
    res.figures = {"freezes": rounds, "frozen_s": frozen_s, "heartbeat_timeout_s": limit,
                   "marked_dead_s": _stats(dead_s), "readmitted_s": _stats(back_s), "requests_meanwhile": dict(served)}
    if dead_s and max(dead_s) > limit + 1.0:
        res.fail(f"marked dead after {max(dead_s):.2f}s")
    if back_s and max(back_s) > 10:
        res.fail(f"re-admitted after {max(back_s):.2f}s")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


def partitions(pool: FaultPool, victim: str, link: NetLink, rounds: int, cut_s: float = 10.0,
               log: Callable[[str], None] = lambda _: None) -> Result:
    """``victim`` runs in a network namespace of its own; its link is cut for ``cut_s`` seconds: the
    engine keeps running and hears nothing, as behind a pulled cable."""
    res = Result("engine partitioned from the pool (veth link down)",
                 f"marked dead within 3 heartbeat intervals ({3 * HEARTBEAT_S:.1f} s, + 0.5 s of scheduling); every "
                 f"request meanwhile served by the other engine; re-admitted within 2 intervals ({2 * HEARTBEAT_S:.1f} s) "
                 "of healing")
    other = next(n for n in ENGINES if n != victim)
    dead_s: list[float] = []
    back_s: list[float] = []
    served: Counter[str] = Counter()
    t_start = time.monotonic()
    for r in range(rounds):
        _outage(pool, res, f"round {r + 1}", victim, other, cut_s, link.cut, link.heal, served, dead_s, back_s)
        if not pool.engines[victim].alive():
            res.fail(f"round {r + 1}: {victim} exited during the partition")
        _coordinator_crashed(pool, res)
        log(f"partition {r + 1}/{rounds}: {victim} dead after {_last(dead_s):.2f}s, "
            f"back {_last(back_s):.2f}s after healing")
    res.figures = {"partitions": rounds, "cut_s": cut_s, "heartbeat_interval_s": HEARTBEAT_S,
                   "marked_dead_s": _stats(dead_s), "readmitted_s": _stats(back_s), "requests_meanwhile": dict(served)}
    if dead_s and max(dead_s) > 3 * HEARTBEAT_S + 0.5:
        res.fail(f"marked dead after {max(dead_s):.2f}s")
    if back_s and max(back_s) > 2 * HEARTBEAT_S:
        res.fail(f"re-admitted after {max(back_s):.2f}s")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


def partitioned_pool(rounds: int, cut_s: float = 10.0, log: Callable[[str], None] = lambda _: None) -> Result:
    """:func:`partitions` on a pool of its own whose ``rel-a`` lives in a network namespace; a machine that
    cannot make one (not root, no iproute2) gives a failed result saying so."""
    try:
        link = NetLink(1)
    except PartitionUnavailable as exc:
        return Result("engine partitioned from the pool (veth link down)", "ran", passed=False, failures=[str(exc)])
    pool = FaultPool(isolate={ENGINES[0]: link})
    try:
        pool.start()
        return partitions(pool, ENGINES[0], link, rounds, cut_s, log=log)
    finally:
        pool.close()
        link.close()


# ----- kill -9 mid store write / mid STATE_PUT ----------------------------------------------------

def verify_store(store_dir: Path) -> dict[str, Any]:
    """``hydractl store verify`` on the directory, plus the coordinator's session index beside it."""
    p = subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", "store", "verify", "--dir", str(store_dir), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    rep = json.loads(p.stdout)
    keys = set(Store(dir=store_dir).objects)
    unreadable = dangling = entries = 0
    for f in (store_dir / "sessions").glob("*.json"):
        entries += 1
        try:
            d = json.loads(f.read_bytes())
            if d["key"] not in keys:
                dangling += 1
        except (OSError, ValueError, KeyError, TypeError):
            unreadable += 1
    return {"exit": p.returncode, "objects": rep["objects"], "chunks": rep["chunks"],
            "bad_chunks": len(rep["bad_chunks"]), "bad_manifests": len(rep["bad_manifests"]),
            "tmp_files": rep["tmp_files"], "unreferenced_chunks": rep["unreferenced_chunks"],
            "index_entries": entries, "index_unreadable": unreadable, "index_dangling": dangling}


def store_kills(pool: FaultPool, rounds: int, seed: int = 2, budget: float = 90.0,
                log: Callable[[str], None] = lambda _: None) -> Result:
    """Sessions take turns (each turn's KV is read over STATE_GET and written to the Store by the
    coordinator, after the answer; a turn whose engine lost the session is restored with STATE_PUT);
    at a random moment of each turn (prefill, decode, or the keeping after it) the coordinator or an
    engine is killed with SIGKILL and restarted. Afterwards the Store and the session index are read."""
    res = Result("kill -9 mid store write / mid STATE_PUT",
                 "0 corrupt store objects (hydractl store verify), 0 unreadable session index entries; every "
                 "turn a complete answer or a clean error; the sessions still answer afterwards")
    rng = random.Random(seed)
    sessions = [f"rel-{seed}-{j}" for j in range(3)]
    convs: dict[str, list[dict[str, str]]] = {
        s: [{"role": "system", "content": f"Session {s}. " + " ".join(f"Rule {k}: answer item {k} in one word."
                                                                        for k in range(60))}] for s in sessions}
    turns: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    after_answer = 0
    t_start = time.monotonic()
    for r in range(rounds):
        s = sessions[r % len(sessions)]
        msgs = [*convs[s], {"role": "user", "content": f"Item {r}?"}]
        box: dict[str, Any] = {}

        def turn() -> None:
            try:
                resp = httpx.post(pool.url + "/v1/chat/completions", timeout=budget, json={
                    "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": msgs, "session_id": s})
                box["status"] = resp.status_code
                box["body"] = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else None
            except httpx.TimeoutException:
                box["status"] = "hang"
            except httpx.HTTPError as exc:
                box["status"] = f"dropped:{type(exc).__name__}"
            box["at"] = time.monotonic()

        target = "coordinator" if r % 2 == 0 else rng.choice(ENGINES)
        th = threading.Thread(target=turn, daemon=True)
        t0 = time.monotonic()
        th.start()
        time.sleep(rng.uniform(0.2, 2.5))
        (pool.coordinator if target == "coordinator" else pool.engines[target]).kill9()
        killed_at = time.monotonic()
        th.join(budget + 5)
        st = box.get("status", "hang")
        if "at" in box and box["at"] < killed_at:
            after_answer += 1
        targets[target] += 1
        turns[str(st)] += 1
        if st == "hang":
            res.fail(f"round {r + 1}: the turn hung")
        elif isinstance(st, str) and target != "coordinator":
            res.fail(f"round {r + 1}: the turn's connection dropped though only an engine died ({st})")
        elif isinstance(st, int) and st != 200 and not (isinstance(box.get("body"), dict) and "error" in box["body"]):
            res.fail(f"round {r + 1}: {st} without OpenAI error JSON")
        if st == 200 and box.get("body"):
            convs[s] = [*msgs, {"role": "assistant", "content": box["body"]["choices"][0]["message"]["content"] or "ok"}]
        try:
            heal(pool)
        except (TimeoutError, RuntimeError) as exc:
            res.fail(f"round {r + 1}: not healed: {exc}")
        log(f"store kill {r + 1}/{rounds}: {target} killed {killed_at - t0:.1f}s into the turn: turn {st}")
    # every session still answers (its kept turn restored, or prefilled again)
    final: Counter[int] = Counter()
    for s in sessions:
        status, _ = chat_once(pool.url, {"model": MODEL, "max_tokens": 4, "temperature": 0, "session_id": s,
                                         "messages": [*convs[s], {"role": "user", "content": "Last item?"}]}, budget)
        final[status] += 1
        if status != 200:
            res.fail(f"session {s} answered {status} after the kills")
    sessions_view = pool.http.get("/admin/sessions", timeout=10).json()
    rep = verify_store(pool.store_dir)
    res.figures = {"kills": rounds, "killed": dict(targets), "killed_after_the_answer": after_answer,
                   "turns": dict(turns), "final_turns": dict(final), "store": rep,
                   "keeper": {k: sessions_view.get(k) for k in ("kept", "keep_failed", "restored", "restore_failed")}}
    corrupt = rep["bad_chunks"] + rep["bad_manifests"]
    res.figures["corrupt_objects"] = corrupt
    if corrupt or rep["exit"] != 0:
        res.fail(f"store verify: {rep}")
    if rep["index_unreadable"]:
        res.fail(f"{rep['index_unreadable']} unreadable session index entries")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


# ----- kill -9 an engine mid-reload ---------------------------------------------------------------

LOADING_STAGES = ("loading_model", "reloading", "warming")


def _health(pool: FaultPool, name: str) -> dict[str, Any]:
    """An engine's own ``/health`` ({} when it does not answer)."""
    try:
        return dict(httpx.get(pool.engine_http[name] + "/health", timeout=2).json())
    except (httpx.HTTPError, ValueError):
        return {}


def _admin_post(url: str, body: dict[str, Any], budget: float, box: dict[str, Any]) -> None:
    """POST an admin request; into ``box``: ``status`` (an int, ``hang`` or ``dropped:...``), ``body``
    (the JSON answer or None), ``seconds`` and the monotonic time it ended (``at``)."""
    t0 = time.monotonic()
    try:
        r = httpx.post(url, json=body, timeout=budget)
        box["status"] = r.status_code
        try:
            box["body"] = r.json()
        except ValueError:
            box["body"] = None
    except httpx.TimeoutException:
        box["status"] = "hang"
    except httpx.HTTPError as exc:
        box["status"] = f"dropped:{type(exc).__name__}"
    box["at"] = time.monotonic()
    box["seconds"] = box["at"] - t0


def _clean_answer(box: dict[str, Any], result_key: str) -> bool:
    """An HTTP answer with a JSON body: the request's own result (``result_key`` in it) or OpenAI error JSON,
    but not ``internal_error`` (a handler that crashed: the error JSON is clean, the code behind it is not)."""
    body = box.get("body")
    if not isinstance(box.get("status"), int) or not isinstance(body, dict):
        return False
    err = body.get("error")
    if isinstance(err, dict):
        return bool(err.get("message")) and err.get("code") != "internal_error"
    return result_key in body


def _time_load(pool: FaultPool, profile: str, name: str, budget: float) -> tuple[dict[str, Any], float | None]:
    """Switch to ``profile`` with no fault, watching ``name``'s ``/health``: the switch's answer, and how
    long ``name`` was seen loading (None when no load was seen)."""
    box: dict[str, Any] = {}
    th = threading.Thread(target=_admin_post, args=(pool.url + "/admin/profile", {"name": profile}, budget, box),
                          daemon=True)
    th.start()
    first = last = None
    while th.is_alive():
        if _health(pool, name).get("stage") in LOADING_STAGES:
            last = time.monotonic()
            first = first or last
        time.sleep(0.01)
    th.join()
    return box, (last - first if first is not None and last is not None else None)


def _delayed_stream(url: str, body: dict[str, Any], delay: float, budget: float, outs: list[Outcome]) -> None:
    time.sleep(delay)
    outs.append(stream_chat(url, body, budget))


def reload_kills(pool: FaultPool, n: int, seed: int = 3, budget: float = 60.0,
                 log: Callable[[str], None] = lambda _: None) -> Result:
    """``n`` times: a profile switch through the coordinator (``POST /admin/profile``) between two profiles
    of the same model whose parameters differ in a way that needs a model load (``use_mmap``, ``n_ctx``),
    with a stream and two short streams running; one engine (alternately) is killed with SIGKILL at a
    seeded random moment of its load, early, mid or late by turns (the load's length measured first by two
    switches without a fault, the longer; the thirds are of 85 % of it, as loads vary). The script restarts the engine
    (systemd's Restart=); the coordinator, whose active profile is the switch's target from the moment the
    switch begins, applies that profile to the engine when it registers again (its model-less start
    differs from the profile)."""
    limit = 10.0
    res = Result("engine kill -9 mid-reload (profile switch)",
                 f"{n} kills of a reloading engine: the coordinator never crashes; the switch request answers (200, "
                 f"or 502 naming the lost engine) within {limit:.0f} s of the kill, never hangs; every client stream "
                 "meanwhile complete or a clean error; the restarted engine serves the profile the coordinator "
                 "reports as active (re-applied when it registers) — time from kill to serving reported")
    rng = random.Random(seed)
    t_start = time.monotonic()
    profiles = list(pool.profile_params)
    active = pool.active_profile() or profiles[0]
    seen_s: list[float] = []
    for _ in range(2):  # there and back, without a fault: the longer load seen is the load's length
        nxt = next(p for p in profiles if p != active)
        box, took = _time_load(pool, nxt, ENGINES[0], budget)
        if box.get("status") != 200 or took is None:
            res.fail(f"the switch without a fault: {box.get('status')} {str(box.get('body'))[:300]}, load seen: {took}")
        seen_s.append(took or 0.0)
        active = nxt
    load_s = max(seen_s) or 0.5
    switch: Counter[str] = Counter()
    client: Counter[str] = Counter()
    client_errors: Counter[str] = Counter()
    bands: Counter[str] = Counter()
    mid_load = 0
    answered_s: list[float] = []
    back_s: list[float] = []
    progress_at_kill: list[float] = []
    for i in range(n):
        victim = ENGINES[i % 2]
        target = next(p for p in profiles if p != active)
        band = ("early", "mid", "late")[i % 3]
        frac = ((i % 3) + rng.random()) / 3
        before = pool.instances()
        outs: list[Outcome] = []
        clients = [threading.Thread(target=_delayed_stream, args=(pool.url, story_body(40_000 + 10 * i + k, m), d,
                                                                   budget, outs), daemon=True)
                   for k, (d, m) in enumerate([(0.0, 64), (0.2, 8), (0.4 + load_s / 2, 8)])]
        for c in clients:
            c.start()
        time.sleep(0.3)
        sw: dict[str, Any] = {}
        th = threading.Thread(target=_admin_post, args=(pool.url + "/admin/profile", {"name": target}, budget, sw),
                              daemon=True)
        th.start()
        seen: dict[str, Any] = {}
        t_load = None
        t_w = time.monotonic()
        while time.monotonic() - t_w < 15 and th.is_alive():
            h = _health(pool, victim)
            if h.get("stage") in LOADING_STAGES:
                t_load, seen = time.monotonic(), h
                break
            time.sleep(0.005)
        if t_load is None:
            res.fail(f"kill {i + 1}: {victim} was never seen loading (switch {sw.get('status')})")
            th.join(budget + 5)
            for c in clients:
                c.join(budget + 5)
            active = target
            continue
        kill_at = t_load + frac * 0.85 * load_s  # loads vary (the cores are shared): the last third ends early
        while time.monotonic() < kill_at:
            h = _health(pool, victim)
            if h and h.get("stage") not in LOADING_STAGES:
                break  # the load ended sooner than measured: killed just after it (counted, not mid-load)
            seen = h or seen
            time.sleep(0.005)
        killed_at = time.monotonic()
        pool.engines[victim].kill9()
        bands[band] += 1
        if seen.get("progress") is not None:
            progress_at_kill.append(float(seen["progress"]))
        th.join(budget + 5)
        st = sw.get("status", "hang")
        switch[str(st)] += 1
        if st == "hang" or not _clean_answer(sw, "ok"):
            res.fail(f"kill {i + 1}: the switch request: {st} {str(sw.get('body'))[:200]}")
        else:
            answered_s.append(max(0.0, sw["at"] - killed_at))
            vr = (sw["body"].get("engines") or {}).get(victim) or {}
            if vr.get("ok") is False:
                mid_load += 1
            elif st == 200:
                log(f"kill {i + 1}: {victim}'s load had ended before the kill")
        _coordinator_crashed(pool, res)
        pool.engines[victim].start()
        try:
            pool.wait_pool(120, not_instances={victim: before[victim]})
            now_active = pool.active_profile()
            if now_active != target:
                res.fail(f"kill {i + 1}: the coordinator reports {now_active!r} active after a switch to {target!r}")
            wait_for(f"{', '.join(ENGINES)} serving {now_active}",
                     lambda: all(pool.serves_profile(e, now_active) for e in ENGINES), 60)  # type: ignore[arg-type]
            back_s.append(time.monotonic() - killed_at)
        except (TimeoutError, RuntimeError) as exc:
            res.fail(f"kill {i + 1}: {victim} not back serving the active profile: {exc}")
            heal(pool)
        for c in clients:
            c.join(budget + 5)
        for o in outs:
            client[o.kind] += 1
            if o.kind == ERROR:
                client_errors[str(o.error_code)] += 1
            if not o.ok:
                res.fail(f"kill {i + 1}: a client stream: {o.kind} {o.detail} (engine {o.engine})")
        if len(outs) != len(clients):
            client[HANG] += len(clients) - len(outs)
            res.fail(f"kill {i + 1}: {len(clients) - len(outs)} client threads never returned")
        active = target
        log(f"reload kill {i + 1}/{n}: {victim} killed {killed_at - t_load:.2f}s into its load ({band}, progress "
            f"{seen.get('progress')}): switch {st} after {sw.get('seconds', 0):.1f}s, clients "
            f"{','.join(o.kind for o in outs)}, serving {target} again {_last(back_s):.1f}s after the kill")
    if active != profiles[0]:  # leave the pool on its default profile
        box = {}
        _admin_post(pool.url + "/admin/profile", {"name": profiles[0]}, budget, box)
        if box.get("status") != 200:
            res.fail(f"the switch back to {profiles[0]}: {box.get('status')} {str(box.get('body'))[:300]}")
    res.figures = {"kills": sum(bands.values()), "asked": n, "load_s": round(load_s, 2), "kill_moment": dict(bands),
                   "progress_at_kill": _stats(progress_at_kill), "victim_load_interrupted": mid_load,
                   "switch_status": dict(switch), "switch_answered_after_kill_s": _stats(answered_s),
                   "client_streams": dict(client), "client_errors": dict(client_errors),
                   "hangs": client[HANG] + switch["hang"],
                   "coordinator_crashes": res.figures.get("coordinator_crashes", 0),
                   "serving_active_profile_again": len(back_s), "kill_to_serving_s": _stats(back_s)}
    kills = sum(bands.values())
    if kills < n:
        res.fail(f"only {kills} of {n} kills landed")
    if mid_load < kills - max(1, kills // 10):
        res.fail(f"only {mid_load} of {kills} kills interrupted the victim's load")
    if answered_s and max(answered_s) > limit:
        res.fail(f"a switch answered {max(answered_s):.1f}s after the kill")
    if len(back_s) != kills:
        res.fail(f"the engine served the active profile again {len(back_s)} times after {kills} kills")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


# ----- kill -9 mid-migration ------------------------------------------------------------------------

def _sessions_stats(pool: FaultPool) -> Counter[str]:
    try:
        d = pool.http.get("/admin/sessions", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return Counter()
    return Counter({k: int(v) for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)})


def _session_turn(pool: FaultPool, session: str, msgs: list[dict[str, str]], budget: float) -> tuple[Any, dict[str, Any]]:
    """One non-streaming turn of ``session``: (status or ``hang``/``dropped:...``, the answer with its
    engine as ``_engine``)."""
    try:
        r = httpx.post(pool.url + "/v1/chat/completions", timeout=budget, json={
            "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": msgs, "session_id": session})
    except httpx.TimeoutException:
        return "hang", {}
    except httpx.HTTPError as exc:
        return f"dropped:{type(exc).__name__}", {}
    try:
        body = r.json()
    except ValueError:
        body = {}
    return r.status_code, {**(body if isinstance(body, dict) else {}), "_engine": r.headers.get("x-hydra-engine")}


def _normal_reply(body: dict[str, Any]) -> bool:
    try:
        ch = body["choices"][0]
        return bool(ch["message"]["content"]) and ch["finish_reason"] in ("stop", "length")
    except (KeyError, IndexError, TypeError):
        return False


def move_kills(pool: FaultPool, rounds: int, seed: int = 4, budget: float = 60.0,
               log: Callable[[str], None] = lambda _: None) -> Result:
    """A session with a long system prompt (about 1,400 tokens) takes a turn: its KV is in a slot of the
    engine routing chose, and kept in the Store after the turn. ``rounds`` times: the coordinator is
    asked to move the session to the other engine (``POST /admin/sessions/move``, as ``hydractl migrate``:
    STATE_GET on the source's merged port streamed into STATE_PUT on the destination's) and, at a seeded
    random moment of the move (its length measured first by a move without a fault), the source engine,
    the destination engine or the coordinator is killed with SIGKILL, by turns, and restarted; then the
    session takes its next turn (which the next round moves again, from wherever it ran). At the end the
    Store is verified."""
    limit = 10.0
    res = Result("kill -9 mid-migration (session move)",
                 f"{rounds} kills: the move request answers (200, or OpenAI error JSON, never a 500 internal_error) within "
                 f"{limit:.0f} s of the kill, "
                 "never hangs (its connection may drop only when the coordinator is killed); 0 corrupt store objects "
                 "(hydractl store verify), 0 unreadable session index entries; the session's next turn 200 with a "
                 "normal reply (its KV in place, restored from the Store or prefilled again: reported); the pool "
                 "back every time")
    rng = random.Random(seed)
    kinds = ("source", "destination", "coordinator")
    t_start = time.monotonic()
    s = f"mv-{seed}"
    msgs = [{"role": "system", "content": f"Session {s}. " + " ".join(f"Rule {k}: answer item {k} in one word."
                                                                       for k in range(100))}]

    def turn(k: int) -> tuple[Any, dict[str, Any], str]:
        """The session's ``k``-th turn, then its keeping awaited: (status, answer, how its KV was found)."""
        c0 = _sessions_stats(pool)
        ask = [*msgs, {"role": "user", "content": f"Item {k}?"}]
        st, body = _session_turn(pool, s, ask, budget)
        if st != 200 or not _normal_reply(body):
            return st, body, "-"
        c1 = _sessions_stats(pool)
        usage = body.get("usage") or {}
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        how = ("restored from the Store" if c1["restored"] > c0["restored"] else
               "moved from its engine then" if c1["moved"] > c0["moved"] else
               "in place" if cached >= int(usage.get("prompt_tokens") or 0) // 2 else "prefilled again")
        msgs[:] = [*ask, {"role": "assistant", "content": body["choices"][0]["message"]["content"]}]
        try:
            wait_for(f"session {s}'s turn {k} kept",
                     lambda: (c := _sessions_stats(pool))["kept"] > c0["kept"] and c["queued"] == 0, 30)
        except TimeoutError as exc:
            log(str(exc))  # not a broken promise: a kill right after may then restore the turn before
        return st, body, how

    st, body, _ = turn(1)
    if st != 200:
        res.fail(f"the session's first turn: {st} {str(body)[:300]}")
        return res
    home = str(body["_engine"])
    box: dict[str, Any] = {}  # the length of a move without a fault
    _admin_post(pool.url + "/admin/sessions/move", {"session": s, "engine": next(e for e in ENGINES if e != home)},
                budget, box)
    move_s = float(box.get("seconds") or 0.2)
    if box.get("status") != 200 or not (box.get("body") or {}).get("moved"):
        res.fail(f"the move without a fault: {box.get('status')} {str(box.get('body'))[:300]}")
    else:
        home = next(e for e in ENGINES if e != home)
    killed: Counter[str] = Counter()
    move: Counter[str] = Counter()
    moved_from: Counter[str] = Counter()
    next_turn: Counter[str] = Counter()
    came_back: Counter[str] = Counter()
    after_answer = 0
    answered_s: list[float] = []
    back_s: list[float] = []
    for r in range(rounds):
        kind = kinds[r % 3]
        src, dst = home, next(e for e in ENGINES if e != home)
        victim = {"source": pool.engines[src], "destination": pool.engines[dst], "coordinator": pool.coordinator}[kind]
        before = pool.instances()
        mv: dict[str, Any] = {}
        th = threading.Thread(target=_admin_post, args=(pool.url + "/admin/sessions/move",
                                                         {"session": s, "engine": dst}, budget, mv), daemon=True)
        th.start()
        time.sleep(rng.uniform(0.0, move_s))
        killed_at = time.monotonic()
        victim.kill9()
        killed[kind] += 1
        th.join(budget + 5)
        st = mv.get("status", "hang")
        move[str(st)] += 1
        if "at" in mv and mv["at"] < killed_at:
            after_answer += 1
        if st == 200 and isinstance(mv.get("body"), dict):
            moved_from[str(mv["body"].get("from"))] += 1
        if st == "hang":
            res.fail(f"round {r + 1}: the move hung")
        elif isinstance(st, str):
            if kind != "coordinator":
                res.fail(f"round {r + 1}: the move's connection dropped though only an engine died ({st})")
        elif not _clean_answer(mv, "session"):
            res.fail(f"round {r + 1}: move {st} without a result or OpenAI error JSON, or a crash: {str(mv.get('body'))[:200]}")
        elif mv["at"] - killed_at > limit:
            res.fail(f"round {r + 1}: the move answered {mv['at'] - killed_at:.1f}s after the kill")
        if "at" in mv:
            answered_s.append(max(0.0, mv["at"] - killed_at))
        if kind != "coordinator":
            _coordinator_crashed(pool, res)
        try:
            heal(pool)
            if kind != "coordinator":
                pool.wait_pool(120, not_instances={victim.name: before[victim.name]})
            back_s.append(time.monotonic() - killed_at)
        except (TimeoutError, RuntimeError) as exc:
            res.fail(f"round {r + 1}: the pool did not come back: {exc}")
        st2, body, how = turn(r + 2)
        next_turn[str(st2)] += 1
        if st2 != 200 or how == "-":
            res.fail(f"round {r + 1}: the next turn: {st2} {str(body)[:200]}")
        else:
            came_back[how] += 1
            home = str(body["_engine"])
        err = (mv.get("body") or {}).get("error") if isinstance(mv.get("body"), dict) else None
        log(f"move kill {r + 1}/{rounds}: {kind} ({victim.name}) killed {killed_at - (mv.get('at', killed_at) - mv.get('seconds', 0)):.2f}s "
            f"into the move {src}→{dst}: move {st}"
            f"{' from ' + str(mv['body'].get('from')) if st == 200 and isinstance(mv.get('body'), dict) else ''}"
            f"{' (' + str(err.get('code')) + ')' if isinstance(err, dict) else ''}"
            f"{' (answered before the kill)' if 'at' in mv and mv['at'] < killed_at else ''}; next turn {st2} on "
            f"{body.get('_engine')}: KV {how}; pool back in {_last(back_s):.1f}s")
    rep = verify_store(pool.store_dir)
    corrupt = rep["bad_chunks"] + rep["bad_manifests"]
    res.figures = {"kills": sum(killed.values()), "killed": dict(killed), "move_s": round(move_s, 3),
                   "killed_after_the_answer": after_answer, "move_status": dict(move),
                   "moved_from": dict(moved_from), "move_answered_after_kill_s": _stats(answered_s),
                   "next_turn": dict(next_turn), "next_turn_kv": dict(came_back),
                   "coordinator_crashes": res.figures.get("coordinator_crashes", 0),
                   "pool_back": len(back_s), "pool_back_s": _stats(back_s), "corrupt_objects": corrupt, "store": rep}
    if corrupt or rep["exit"] != 0:
        res.fail(f"store verify: {rep}")
    if rep["index_unreadable"]:
        res.fail(f"{rep['index_unreadable']} unreadable session index entries")
    if len(back_s) != sum(killed.values()):
        res.fail(f"the pool came back {len(back_s)} times after {sum(killed.values())} kills")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


# ----- floods --------------------------------------------------------------------------------------

def _probe(url: str, seconds: float, stop: threading.Event | None = None) -> list[float]:
    """Sequential short chats for ``seconds``: each one's latency (a failure counts as the budget)."""
    out: list[float] = []
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < seconds and not (stop and stop.is_set()):
        status, took = chat_once(url, {"model": MODEL, "max_tokens": 8, "temperature": 0,
                                       "messages": [{"role": "user", "content": f"Say hello number {i % 5}."}]}, 30)
        out.append(took if status == 200 else 30.0)
        i += 1
    return out


def _flood_proc(args: list[str], nofile: int, seconds: float) -> dict[str, Any]:
    """Run a flood generator as a niced child under an address-space and fd limit; its JSON report."""
    cmd = ["nice", "-n", "5", "prlimit", f"--nofile={nofile}", f"--as={2 << 30}", "--",
           sys.executable, "-m", "tests.support.floods", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=seconds + 120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    if p.returncode != 0:
        return {"error": err[-1000:]}
    return json.loads(out.strip().splitlines()[-1])


def _flood(pool: FaultPool, name: str, goal: str, probe_url: str, baseline_s: float,
           attack: Callable[[], dict[str, Any]], latency_goal: bool = True) -> Result:
    res = Result(name, goal)
    t_start = time.monotonic()
    base = _probe(probe_url, baseline_s)
    during: list[float] = []
    stop = threading.Event()
    with Sampler(pool.pids) as sampler:
        prober = threading.Thread(target=lambda: during.extend(_probe(probe_url, 600, stop)), daemon=True)
        prober.start()
        report = attack()
        stop.set()
        prober.join(60)
        sampler.settle(3.0)
    res.figures = {"attack": report, "p99_without_s": p99(base), "p99_during_s": p99(during),
                   "probes": [len(base), len(during)], "daemons": sampler.peaks.as_dict()}
    if base and during:
        res.figures["p99_ratio"] = round(p99(during) / p99(base), 2)  # type: ignore[operator]
        if latency_goal and res.figures["p99_ratio"] > 2.0:
            res.fail(f"p99 during the flood {p99(during)}s is {res.figures['p99_ratio']}x the {p99(base)}s without")
    if "error" in report:
        res.fail(f"the flood generator failed: {report['error']}")
    for d in [pool.coordinator, *pool.engines.values()]:
        if not d.alive():
            res.fail(f"{d.name} died during the flood: {d.log_tail(1500)}")
    for n, v in sampler.peaks.as_dict().items():
        if "after" in v and "before" in v and v["after"]["fds"] > v["before"]["fds"] + 16:
            res.fail(f"{n} kept {v['after']['fds'] - v['before']['fds']} more fds 3 s after the flood")
    try:
        heal(pool)
    except (TimeoutError, RuntimeError) as exc:
        res.fail(f"not healed: {exc}")
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


def control_flood(pool: FaultPool, rate: float = 1000, seconds: float = 10, latency_goal: bool = True) -> Result:
    target = ENGINES[0]
    port = pool.engine_rpc[target]
    return _flood(pool, f"{rate:.0f} control connections/s at the merged port, {seconds:.0f} s",
                  f"{target} keeps serving; its own door's p99 latency during ≤ 2x without; no fd kept",
                  pool.engine_http[target], min(10.0, seconds),
                  lambda: _flood_proc(["control", "--port", str(port), "--rate", str(rate), "--seconds", str(seconds)],
                                      4096, seconds), latency_goal=latency_goal)


def bus_flood(pool: FaultPool, seconds: float = 10, peers: int = 8, latency_goal: bool = True) -> Result:
    """A bus peer (several) sending faster than the coordinator reads: the fuzzer's bus inputs, forged
    engine identities, token-less REGISTERs, oversized frames. The real engines must stay registered
    throughout (their heartbeats share the ROUTER with the flood)."""
    down: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                for name, e in pool.engines_view().items():
                    if not e.get("alive"):
                        down.append(name)
            except httpx.HTTPError:
                pass
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        res = _flood(pool, f"a bus flood: {peers} peers at the coordinator's ROUTER, {seconds:.0f} s",
                     "the coordinator keeps serving (front-door p99 during ≤ 2x without); both engines stay "
                     "registered throughout; no fd kept",
                     pool.url, min(10.0, seconds),
                     lambda: _flood_proc(["bus", "--endpoint", pool.bus, "--seconds", str(seconds), "--peers", str(peers)],
                                         4096, seconds), latency_goal=latency_goal)
    finally:
        stop.set()
        watcher.join(5)
    res.figures["engines_seen_down"] = sorted(set(down))
    if down:
        res.fail(f"engines marked down during the flood: {sorted(set(down))}")
    return res


def halfopen_flood(pool: FaultPool, count: int = 10_000, hold: float = 10) -> Result:
    import resource
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], count + 1024)
    res = _flood(pool, f"{count:,} half-open HTTP connections at the front door, held {hold:.0f} s",
                 "the coordinator keeps serving; front-door p99 latency during ≤ 2x without; every connection held "
                 "past the 10 s header deadline closed by the server; no fd kept",
                 pool.url, min(10.0, hold),
                 lambda: _flood_proc(["halfopen", "--port", str(pool.port), "--count", str(count), "--hold", str(hold)],
                                     nofile, hold))
    a = res.figures["attack"]
    if a.get("past_deadline") and a["closed_past_deadline"] < a["past_deadline"]:
        res.fail(f"{a['past_deadline'] - a['closed_past_deadline']} of {a['past_deadline']} connections held past the "
                 "10 s header deadline were still open")
    res.figures["flood_fd_limit"] = nofile
    res.figures["coordinator_fd_limit"] = _fd_limit(pool.coordinator.pid) if pool.coordinator.alive() else None
    return res


def _fd_limit(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError):
        pass
    return None


def stream_flood(pool: FaultPool, count: int = 200, budget: float = 240.0, max_tokens: int = 16) -> Result:
    def attack() -> dict[str, Any]:
        t0 = time.monotonic()
        with ThreadPoolExecutor(count) as ex:
            outs = list(ex.map(lambda i: stream_chat(pool.url, story_body(30_000 + i, max_tokens), budget), range(count)))
        kinds = Counter(o.kind for o in outs)
        codes = Counter(o.error_code for o in outs if o.kind == ERROR)
        done = [o.seconds for o in outs if o.kind == COMPLETE]
        return {"streams": count, "seconds": round(time.monotonic() - t0, 1), "outcomes": dict(kinds),
                "errors": dict(codes), "stream_p99_s": p99(done), "stream_median_s": _stats(done).get("median")}

    res = _flood(pool, f"{count} concurrent streams at the front door",
                 "every stream a complete answer or a clean error (no hang, no garbled stream); the "
                 "coordinator forgets them all; (a short probe waits behind them: its latency is reported, "
                 "not held to 2x)", pool.url, 8.0, attack, latency_goal=False)
    a = res.figures["attack"]
    bad = {k: v for k, v in a.get("outcomes", {}).items() if k not in (COMPLETE, ERROR)}
    if bad:
        res.fail(f"streams that were neither complete nor a clean error: {bad}")
    try:
        _, took = wait_for("nothing in flight at the coordinator", lambda: pool.inflight() == 0, 30)
        res.figures["inflight_zero_after_s"] = round(took, 1)
    except TimeoutError as exc:
        res.fail(str(exc))
    return res

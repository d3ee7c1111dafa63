"""Partitions and latency on the multi-host test bed (:class:`tests.support.netpartition.Bed`): the
coordinator and both engines each in a namespace of their own, every link delayed, the clients on the
bed's bridge. Every load loop here is bounded in count and in time.

- :func:`engine_cut_under_load`: steady streaming load through the front door while one engine's link is
  cut for ``cut_s``: every request a complete answer (the greedy answer, exactly once: never two engines'
  text spliced, one ``[DONE]``) or a clean error, none hung or dropped; the engine declared dead within 3
  heartbeat intervals, re-admitted within 2 of the healing as the same process, registered once.
- :func:`coordinator_cut`: the coordinator's link cut for ``cut_s``: each engine keeps answering its
  direct clients; after the healing both are alive again as the same processes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from typing import Any

import httpx

from tests.support.faultpool import ENGINES, HEARTBEAT_S, LIVENESS, MODEL, FaultPool
from tests.support.faultscenarios import Result, _stats
from tests.support.netpartition import Bed
from tests.support.streamcheck import COMPLETE, ERROR, stream_chat

BODY = {"model": MODEL, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Name three colours."}]}
MAX_REQUESTS_PER_CLIENT = 400


def _content(lines: list[str]) -> str:
    out = []
    for line in lines:
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices") or []:
                out.append((ch.get("delta") or {}).get("content") or "")
    return "".join(out)


class Load:
    """``clients`` threads, each sending streaming chats back to back until stopped (at most
    ``MAX_REQUESTS_PER_CLIENT`` each, and none begun after ``budget_s``)."""

    def __init__(self, url: str, clients: int, budget_s: float) -> None:
        self.url = url
        self.stop = threading.Event()
        self.deadline = time.monotonic() + budget_s
        self.outcomes: list[tuple[float, Any, str]] = []  # (start time, Outcome, content)
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if self.stop.is_set() or time.monotonic() > self.deadline:
                return
            t0 = time.monotonic()
            out = stream_chat(self.url, BODY, budget=30)
            with self._lock:
                self.outcomes.append((t0, out, _content(out.lines)))

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(40)


def _register_count(pool: FaultPool, name: str) -> int:
    """How many times the coordinator logged ``name`` coming up (a registration it admitted as new)."""
    return len(re.findall(rf'msg="engine up" engine={re.escape(name)} ', pool.coordinator.log_tail(10**8)))


def engine_cut_under_load(pool: FaultPool, bed: Bed, victim: str = ENGINES[0], cut_s: float = 10.0,
                          clients: int = 3) -> Result:
    res = Result("engine cut off under load (multi-host bed)",
                 f"0 requests lost or served twice; {victim} dead within {LIVENESS} heartbeats "
                 f"({LIVENESS * HEARTBEAT_S:.1f} s, + 0.5 s of scheduling), re-admitted within 2 "
                 f"({2 * HEARTBEAT_S:.1f} s) of the healing, as the same process, registered once")
    other = next(n for n in ENGINES if n != victim)
    t_start = time.monotonic()
    expected = stream_chat(pool.url, BODY, budget=30)
    want = _content(expected.lines)
    if expected.kind != COMPLETE or not want:
        res.fail(f"the baseline request failed: {expected.kind} {expected.detail}")
        return res
    pid = pool.engines[victim].pid
    ups_before = _register_count(pool, victim)
    direct = [stream_chat(pool.engine_http[n], BODY, budget=30).ttft or 0.0 for n in ENGINES for _ in range(3)]
    front = [stream_chat(pool.url, BODY, budget=30).ttft or 0.0 for _ in range(6)]
    load = Load(pool.url, clients, budget_s=cut_s + 40)
    time.sleep(2.0)
    cut_at = time.monotonic()
    bed.nodes[victim].cut()
    dead_s = back_s = None
    try:
        dead_s = pool.wait_dead(victim, 15)
        time.sleep(max(0.0, cut_s - (time.monotonic() - cut_at)))
    except TimeoutError as exc:
        res.fail(str(exc))
    finally:
        bed.nodes[victim].heal()
    healed_at = time.monotonic()
    try:
        back_s = pool.wait_alive(victim, 30)
        pool.wait_pool(60)
    except (TimeoutError, RuntimeError) as exc:
        res.fail(f"not re-admitted: {exc}")
    time.sleep(2.0)
    load.end()
    kinds: Counter[str] = Counter()
    by: Counter[str] = Counter()
    for t0, out, text in load.outcomes:
        during = cut_at <= t0 < healed_at
        kinds[f"{out.kind}{' (cut)' if during else ''}"] += 1
        if out.kind == COMPLETE:
            by[str(out.engine)] += 1
            if text != want:
                res.fail(f"an answer by {out.engine} is not the greedy answer once: {text!r} (want {want!r})")
        elif out.kind != ERROR:
            res.fail(f"a request was {out.kind}: {out.detail}")
    if not any(out.kind == COMPLETE and cut_at <= t0 < healed_at and out.engine == other
               for t0, out, _ in load.outcomes):
        res.fail(f"no request was answered by {other} while {victim} was cut off")
    view = pool.engines_view()
    if pool.engines[victim].pid != pid or not view[victim]["alive"]:
        res.fail(f"{victim} is not the same process alive again")
    ups = _register_count(pool, victim) - ups_before
    if ups != 1:
        res.fail(f"{victim} registered {ups} times after the healing (want once)")
    if dead_s is not None and dead_s > LIVENESS * HEARTBEAT_S + 0.5:
        res.fail(f"declared dead after {dead_s:.2f} s")
    if back_s is not None and back_s > 2 * HEARTBEAT_S:
        res.fail(f"re-admitted {back_s:.2f} s after the healing")
    res.figures = {"shaping": bed.shaping, "delay_ms": bed.delay_ms, "jitter_ms": bed.jitter_ms, "cut_s": cut_s,
                   "heartbeat_interval_s": HEARTBEAT_S, "dead_after_s": dead_s, "readmitted_after_s": back_s,
                   "requests": dict(kinds), "answered_by": dict(by), "registrations_after_heal": ups,
                   "ttft_direct_s": _stats(direct), "ttft_front_door_s": _stats(front)}
    res.seconds = round(time.monotonic() - t_start, 1)
    return res


def coordinator_cut(pool: FaultPool, bed: Bed, cut_s: float = 10.0) -> Result:
    res = Result("coordinator cut off (multi-host bed)",
                 "every engine answers its direct clients throughout; both alive again after the healing, as the "
                 "same processes")
    t_start = time.monotonic()
    pids = {n: pool.engines[n].pid for n in ENGINES}
    served: Counter[str] = Counter()
    bed.nodes["coordinator"].cut()
    t0 = time.monotonic()
    try:
        for _ in range(200):  # bounded in count and time
            if time.monotonic() - t0 > cut_s:
                break
            for n in ENGINES:
                out = stream_chat(pool.engine_http[n], BODY, budget=15)
                served[f"{n} {out.kind}"] += 1
                if out.kind != COMPLETE:
                    res.fail(f"{n}'s direct client got {out.kind} while the coordinator was cut off: {out.detail}")
    finally:
        bed.nodes["coordinator"].heal()
    try:
        back = pool.wait_pool(60)
    except (TimeoutError, RuntimeError) as exc:
        res.fail(f"the pool did not come back: {exc}")
        back = None
    if any(pool.engines[n].pid != p for n, p in pids.items()):
        res.fail("an engine restarted")
    try:
        r = httpx.post(pool.url + "/v1/chat/completions", json=BODY, timeout=30)
        if r.status_code != 200:
            res.fail(f"the front door after the healing: {r.status_code}")
    except httpx.HTTPError as exc:
        res.fail(f"the front door after the healing: {exc}")
    res.figures = {"shaping": bed.shaping, "cut_s": cut_s, "direct_requests": dict(served),
                   "pool_back_after_s": round(back, 2) if back is not None else None}
    res.seconds = round(time.monotonic() - t_start, 1)
    return res

#!/usr/bin/env python3
"""Unavailability during a model switch, per reload policy, next to the raw load time.

A client sends short completions back to back (one at a time, like a steady user) while the
engine switches SmolLM2-135M → Gemma-3-270M → SmolLM2-135M. For each policy we report the
longest gap between two successful responses during a switch, each model's steady-state gap
(measured while it alone serves), the gap over the slower model's steady gap (a request on the
slower model takes longer whatever the switch does), failed requests, p50/p99 request latency
during the switch vs steady state, and the model load time measured by the engine itself.
Medians over the switches.

The client repeats one prompt, so in steady state each request finds all but its last prompt token
in its slot's KV, and the first request of a new generation cannot (a new model has no KV): it
prefills the whole prompt, which is work the switch did not cause the service to lose.
``--no-cache-prompt`` sends ``cache_prompt: false``, so steady requests and the first one after a
switch do the same work and a gap measures only what the switch costs.

A switch's longest gap is the maximum over a window of a couple of seconds (the load, then the
paced free of the old model), so it also holds whatever stall the host puts into any window that
long. Each switch is therefore followed by a control window of the same length with no switch in
it, and its longest gap is reported beside the switch's: on a host whose steady serving stalls now
and then, the control says how much of a switch's gap is the switch. Each switch's window is also
split by what the switch was doing: the gaps that overlap a part of the load (the engine's
``timings``: weights, context, warm-up, install), the new generation's first turns or a part of
the old one's paced free (the reaper's log line) are the switch's own; the longest of the others
lies in its quiet rest, which only the host fills. And each answer's ``timings.server_ms`` (its time
in the engine's HTTP handler) splits a request's time, as the client saw it, into the engine's and the
rest (the HTTP layer around the handler, the network, the client): each gap is also given with that
rest held at its steady median, which is the gap the engine alone made.

    .venv/bin/python scripts/bench_reload.py --switches 6
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as _dt
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hydrad.common import heap  # noqa: E402
from hydrad.engine.settings import ReaperSettings  # noqa: E402
from tests.support.engine import Engine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gil_holders  # noqa: E402

MODELS = ("gemma3-270m", "smollm2-135m")  # the first is switched to first; --models replaces them


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Client(threading.Thread):
    def __init__(self, url: str, cache_prompt: bool = True) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.body: dict[str, Any] = {"prompt": "Say hello", "max_tokens": 4, "temperature": 0}
        if not cache_prompt:
            self.body["cache_prompt"] = False
        self.stop = threading.Event()
        self.log: list[tuple[float, float, int]] = []  # (start, end, status)
        self.served: dict[float, dict[str, Any]] = {}  # end → what the engine said of the request

    def run(self) -> None:
        # No collector pass in this process while it times requests: a full pass over its heap (45,000
        # objects, 17 ms on the 2-core machine) would count as a gap of the engine's.
        with heap.paused(), httpx.Client(base_url=self.url, timeout=120) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                info: dict[str, Any] = {}
                try:
                    r = c.post("/v1/completions", json=self.body)
                    status = r.status_code
                    if status == 200:
                        body = r.json()
                        info = {"model": body.get("model"), **{k: body.get("timings", {}).get(k) for k in SERVED}}
                except (httpx.HTTPError, ValueError):
                    status = 0
                t1 = time.monotonic()
                self.served[t1] = info
                self.log.append((t0, t1, status))


def window(log: list[tuple[float, float, int]], a: float, b: float) -> list[tuple[float, float, int]]:
    return [r for r in log if a <= r[1] <= b]


# what each response's ``timings`` say of where its time went, kept for the requests around a switch's longest gap
SERVED = ("queue_ms", "admit_ms", "prompt_ms", "predicted_ms", "server_ttft_ms", "server_ms")
STEADY_AFTER_S = 1.5  # after each switch, how long the new model serves alone for its own steady gap


def median_gap(entries: list[tuple[float, float, int]]) -> float:
    """The median time between two consecutive responses ending."""
    ends = [e for _, e, _ in entries]
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def longest_gap(entries: list[tuple[float, float, int]], start: float, end: float) -> tuple[float, float]:
    """Where (its start) and how long the longest stretch of [start, end] without a successful response is."""
    ends = [start] + sorted(e for _, e, st in entries if st == 200) + [end]
    return max(((a, b - a) for a, b in zip(ends, ends[1:])), key=lambda x: x[1])


def outside_ms(client: "Client", entry: tuple[float, float, int]) -> float | None:
    """How much of a request's time, as its client saw it, lay outside the engine's handler (its
    ``server_ms``): the HTTP layer before and after the handler, the network and the client itself."""
    server = client.served.get(entry[1], {}).get("server_ms")
    return None if server is None else (entry[1] - entry[0]) * 1000 - float(server)


def server_gap(client: "Client", entries: list[tuple[float, float, int]], start: float, end: float,
               base_ms: float) -> float:
    """The longest stretch of [start, end] without a response, each stretch less what the response that
    closes it spent outside the engine's handler beyond ``base_ms`` (that time's steady median): the gap
    the client would have seen had the HTTP layer, the network and the client kept their steady pace.
    A stretch belongs to the response that ends it (the client sends one request at a time, so the time
    of the one before only delays where this one starts)."""
    done = sorted((r for r in entries if r[2] == 200 and start <= r[1] <= end), key=lambda r: r[1])
    longest, last = 0.0, start
    for r in done:
        outside = outside_ms(client, r)
        extra = 0.0 if outside is None else max(0.0, outside - base_ms) / 1000
        longest = max(longest, r[1] - last - extra)
        last = r[1]
    return max(longest, end - last)


FIRST_TURNS_S = 0.25  # after the install, the new generation's first turns count as the switch's own
FREE_TAIL_S = 0.05  # and so does a step that starts just after a part of the old generation was freed


def load_phases(t1: float, timings: dict[str, float]) -> list[tuple[str, float, float]]:
    """Where a load's parts lay, in the clock of ``t1`` (when the configure call that waited for the
    install returned): they end at the install and follow each other back from it (the engine's
    ``timings``: model_s, context_s, warmup_s, install_s)."""
    out: list[tuple[str, float, float]] = [("first turns", t1, t1 + FIRST_TURNS_S)]
    end = t1
    for name, key in (("install", "install_s"), ("warm-up", "warmup_s"), ("context", "context_s"),
                      ("weights", "model_s")):
        took = float(timings.get(key) or 0.0)
        out.append((name, end - took, end))
        end -= took
    return out


def log_time(ts: str, to_mono: float) -> float:
    """An engine log line's ``ts`` (UTC, without its ``Z``) in the monotonic clock (``to_mono``: add to a
    wall-clock time)."""
    return _dt.datetime.fromisoformat(ts).replace(tzinfo=_dt.timezone.utc).timestamp() + to_mono


def free_phases(log_text: str, to_mono: float) -> list[tuple[str, float, float]]:
    """Where each part of each retired generation's free lay, from the engine's ``generation retired``
    lines (stamped when the last part ended, with each part's time and start), in the monotonic clock
    (``to_mono``: add to a wall-clock time)."""
    out = []
    for m in re.finditer(r"ts=(\S+?)Z .*generation retired.* parts=(\S+) starts_ms=(\S+)", log_text):
        ended = log_time(m.group(1), to_mono)
        parts = [(p.split(":")[0], float(p.split(":")[1]) / 1000) for p in m.group(2).split(",")]
        starts = [float(x) / 1000 for x in m.group(3).split(",")]
        if len(parts) != len(starts) or not parts:
            continue
        began = ended - (starts[-1] + parts[-1][1])
        out += [(f"free {name}", began + at, began + at + took + FREE_TAIL_S) for (name, took), at in zip(parts, starts)]
    return out


def loop_holds(log_text: str, to_mono: float) -> list[tuple[float, float, str]]:
    """When the engine's event loop was held (its ``event loop held`` lines, each stamped when the held
    callback finally ran, with how long it waited and where the loop was), in the monotonic clock."""
    out = []
    for m in re.finditer(r'ts=(\S+?)Z .*msg="event loop held" ms=([0-9.]+) where=("(?:[^"\\]|\\.)*"|\S+)', log_text):
        ended = log_time(m.group(1), to_mono)
        out.append((ended - float(m.group(2)) / 1000, ended, m.group(3).strip('"')))
    return out


def gaps_by_phase(ends: list[float], start: float, end: float,
                  phases: list[tuple[str, float, float]]) -> dict[str, Any]:
    """The longest stretch of [start, end] without a response that overlaps some phase of the switch (its
    own), and the longest that overlaps none (quiet: what the host did on its own), with the phases."""
    marks = [start] + sorted(e for e in ends if start < e < end) + [end]
    own: tuple[float, float, list[str]] = (0.0, start, [])
    quiet: tuple[float, float] = (0.0, start)
    for a, b in zip(marks, marks[1:]):
        names = [n for n, p0, p1 in phases if p0 < b and p1 > a]
        if names and b - a > own[0]:
            own = (b - a, a, names)
        elif not names and b - a > quiet[0]:
            quiet = (b - a, a)
    return {"own_gap_s": own[0], "own_from_s": own[1] - start, "own_phases": own[2],
            "quiet_gap_s": quiet[0], "quiet_from_s": quiet[1] - start}


def around(client: Client, during: list[tuple[float, float, int]], gap_at: float, gap: float,
           t0: float) -> list[dict[str, Any]]:
    """The responses that opened and closed the longest gap and the one after, times in ms since the
    configure call, with what the engine said of each (its model, queue, prompt and decode times)."""
    ends = sorted(during, key=lambda r: r[1])
    near = [r for r in ends if gap_at - 1e-6 <= r[1] <= gap_at + gap + 1e-6]
    later = [r for r in ends if r[1] > gap_at + gap + 1e-6][:1]
    out = []
    for a, b, st in near + later:
        outside = outside_ms(client, (a, b, st))
        out.append({"sent_ms": round((a - t0) * 1000, 2), "ended_ms": round((b - t0) * 1000, 2), "status": st,
                    **client.served.get(b, {}), **({} if outside is None else {"outside_ms": round(outside, 2)})})
    return out


class BlockedSampler:
    """scripts/sample_blocked.py beside the engine: where its step thread and its loaders waited in a system
    call for ``min_ms`` or longer, in the clock the switches are stamped with (``time.monotonic``)."""

    def __init__(self, pid: int, min_ms: float, into: Path) -> None:
        self.out = into  # a file, not a pipe: read only at the end, a pipe would fill and stall the sampler
        with open(into, "w") as f:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sample_blocked.py")),
                                          "--pid", str(pid), "--min-ms", str(min_ms),
                                          "--names", "hydrad-engine,hydrad-loader"],
                                         stdout=f, stderr=subprocess.PIPE, text=True)

    def stop(self) -> list[dict[str, Any]]:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=60)
        if self.proc.returncode not in (0, -signal.SIGTERM):
            print(f"  blocked-call sampler ended with {self.proc.returncode}: {err.strip()[-300:]}", flush=True)
        return [json.loads(ln) for ln in self.out.read_text().splitlines() if ln.strip()]


def blocked_between(stretches: list[dict[str, Any]], a: float, b: float, t0: float) -> list[dict[str, Any]]:
    """The stretches that overlap [a, b], times in ms since ``t0`` (the configure call)."""
    return [{"thread": s["name"], "call": s["call"], "ms": s["ms"], "wchan": s["wchan"],
             "from_ms": round((s["start"] - t0) * 1000, 1), **({"futex_in": s["futex_in"]} if "futex_in" in s else {})}
            for s in stretches if s["start"] < b and s["end"] > a]


def run_policy(policy: str, switches: int, tmp: Path, models: tuple[str, ...] = MODELS,
               slow_turn_ms: float = 0.0, config: dict[str, Any] | None = None,
               cache_prompt: bool = True, blocked_ms: float = 0.0, gil_profile: bool = False,
               slow_loop_ms: float = 0.0) -> dict[str, Any]:
    config = config or {}
    reaper = ReaperSettings(**(config.get("reaper") or {}))
    # the paced free (reaper.delay_ms, pause_ms) ends after the switch: its gaps count as the switch's
    settle = 0.5 + (reaper.delay_ms + reaper.pause_ms) / 1000
    extra = {k: v for k, v in config.items() if k != "defaults"}  # a variant's "defaults" adds to the runtime's
    e = Engine(tmp, defaults={"model": models[1], "temperature": 0, "reload_policy": policy,
                              "reload_queue_timeout_s": 120, "n_parallel": 2, **config.get("defaults", {})},
               name=f"bench-{policy}-{time.monotonic_ns()}",
               extra={**extra, "logging": {"slow_turn_ms": slow_turn_ms, "slow_loop_ms": slow_loop_ms,
                                           **config.get("logging", {})}})
    sampler: BlockedSampler | None = None
    holders: gil_holders.Recording | None = None
    try:
        e.wait_ready(120)
        if gil_profile:
            holders = gil_holders.Recording(e.proc.pid)
        if blocked_ms:
            sampler = BlockedSampler(e.proc.pid, blocked_ms, tmp / f"blocked-{time.monotonic_ns()}.jsonl")
        client = Client(e.url, cache_prompt)
        client.start()
        while len(client.log) < 2:  # the first request pays for lazy allocations
            time.sleep(0.05)
        steady_start = time.monotonic()
        time.sleep(3)
        steady_end = time.monotonic()
        steady = window(client.log, steady_start, steady_end)
        if len(steady) < 3:
            raise SystemExit(f"too few steady responses ({len(steady)}) to measure; is the machine busy?")
        steady_gap = median_gap(steady)
        outs = [x for x in (outside_ms(client, r) for r in steady if r[2] == 200) if x is not None]
        base_outside = statistics.median(outs) if outs else 0.0  # ms a request spends outside the handler
        steady_of = {models[1]: steady_gap}  # each model's own steady gap, measured while it alone serves
        results = []
        for i in range(switches):
            target, source = models[i % 2], models[(i + 1) % 2]
            t0, t0_wall = time.monotonic(), time.time()
            r = e.http.post("/control/configure?wait=1", json={"model": target}, timeout=300)
            t1 = time.monotonic()
            body = r.json()
            if r.status_code != 200:
                raise SystemExit(f"switch to {target} failed: {body}")
            time.sleep(settle)
            during = window(client.log, t0, t1 + settle)
            span = t1 + settle - t0  # the switch's window; the control window after it is as long
            time.sleep(max(STEADY_AFTER_S, span))
            after = window(client.log, t1 + settle, t1 + settle + STEADY_AFTER_S)
            if len(after) >= 3:
                steady_of[target] = median_gap(after)
            gap_at, gap = longest_gap(during, t0, t1 + settle)
            c0, c1 = t1 + settle, t1 + settle + span
            _, control_gap = longest_gap(window(client.log, c0, c1), c0, c1)
            gap_server = server_gap(client, during, t0, t1 + settle, base_outside)
            control_server = server_gap(client, window(client.log, c0, c1), c0, c1, base_outside)
            # A request on the slower model takes longer whatever the switch does: the switch's own cost is
            # its longest gap over the slower model's steady gap.
            slower = max(steady_of.get(source, steady_gap), steady_of.get(target, steady_gap))
            results.append({"target": target, "switch_s": t1 - t0, "max_gap_s": gap, "slower_steady_s": slower,
                            "ratio_slower": gap / slower,
                            "control_gap_s": control_gap, "control_ratio": control_gap / slower,
                            "server_gap_s": gap_server, "server_ratio": gap_server / slower,
                            "control_server_ratio": control_server / slower,
                            "gap_from_ms": round((gap_at - t0) * 1000, 1),  # since the configure call
                            "t0_wall": t0_wall,
                            "timings": body["load"].get("timings"),
                            "load_s": body["load"]["timings"].get("load_s"), "policy": body["load"]["policy"],
                            "around_gap": around(client, during, gap_at, gap, t0),
                            "failed": sum(1 for *_, st in during if st != 200),
                            "latencies": [end - start for start, end, st in during if st == 200],
                            "windows": (t0, gap_at, gap_at + gap, t1 + settle),
                            "t1": t1})
            tm = body["load"].get("timings") or {}
            print(f"  switch {i + 1} to {target}: longest gap {gap * 1000:.1f} ms from {(gap_at - t0) * 1000:.0f} ms "
                  f"({gap / slower:.2f}x; load {tm.get('load_s')} s, warm-up {tm.get('warmup_s')} s); around it: " + "; ".join(
                      f"[{x['sent_ms']:.0f}-{x['ended_ms']:.0f} {str(x.get('model'))[:12]} q{x.get('queue_ms')} "
                      f"p{x.get('prompt_ms')} d{x.get('predicted_ms')} outside {x.get('outside_ms')}]"
                      for x in results[-1]["around_gap"])
                  + f"; outside the handler at its steady {base_outside:.1f} ms: {gap_server * 1000:.1f} ms "
                  f"({gap_server / slower:.2f}x); a window as long after it, no switch: longest gap "
                  f"{control_gap * 1000:.1f} ms ({control_gap / slower:.2f}x)", flush=True)
        client.stop.set()
        client.join(30)
        gil: dict[str, Any] = {}
        if holders is not None:
            gil, holders = holders.stop(), None
            for thread, h in gil.items():
                print(f"  interpreter lock held by {thread}: {h['ms']:.0f} ms over the run; most in "
                      + "; ".join(f"{f} {ms:.0f} ms" for f, ms in h["top"][:3]), flush=True)
        if sampler is not None:
            stretches = sampler.stop()
            sampler = None
            for i, r in enumerate(results):
                t0, gap_from, gap_to, end = r["windows"]
                r["blocked_in_gap"] = blocked_between(stretches, gap_from, gap_to, t0)
                # the switch's 20 longest (a waiting reaper or an idle loop would fill the JSON)
                r["blocked_during"] = sorted(blocked_between(stretches, t0, end, t0), key=lambda x: -x["ms"])[:20]
                print(f"  switch {i + 1}: in its longest gap ({(gap_from - t0) * 1000:.0f}-{(gap_to - t0) * 1000:.0f} ms) "
                      + ("; ".join(f"{x['thread']} in {x['call']} {x['ms']:.1f} ms from {x['from_ms']:.0f} ({x['wchan']}"
                                   + (f", a lock in {x['futex_in']}" if "futex_in" in x else "") + ")"
                                   for x in r["blocked_in_gap"]) or "no thread blocked that long"), flush=True)
        # how long freeing each retired generation took (on the engine's reaper thread, off its step loop)
        log_text = e.log_path.read_text()
        free_ms = [float(m.group(1)) for m in re.finditer(r"generation retired.* free_ms=([0-9.]+)", log_text)]
        free_parts = re.findall(r"generation retired.* parts=(\S+)", log_text)
        # with --slow-turn-ms: the engine's own account of each turn of its loop that held the streams up
        slow_turns = [ln for ln in log_text.splitlines() if "slow engine turn" in ln or "msg=stage" in ln
                      or "model ready" in ln or "generation retired" in ln or "event loop held" in ln] \
            if slow_turn_ms or slow_loop_ms else []
        # each switch's longest gap in its own phases (the load's parts, its first turns, the paced free)
        # and in the quiet rest of its window, which only the host's own stalls fill
        to_mono = time.monotonic() - time.time()  # the log is stamped in wall-clock time
        freed = free_phases(log_text, to_mono)
        holds = loop_holds(log_text, to_mono)
        for r in results:
            t0, gap_from, gap_to, end = r["windows"]
            if slow_loop_ms:  # with --slow-loop-ms: what held the engine's event loop within the longest gap
                r["loop_held_in_gap"] = [{"from_ms": round((a - t0) * 1000, 1), "ms": round((b - a) * 1000, 1),
                                          "where": at} for a, b, at in holds if a < gap_to and b > gap_from]
                print(f"  switch to {r['target']}: event loop held in its longest gap: "
                      + ("; ".join(f"{h['ms']} ms from {h['from_ms']} ms in {h['where']}" for h in r["loop_held_in_gap"])
                         or f"never over {slow_loop_ms} ms"), flush=True)
            ends = [e for _, e, st in window(client.log, t0, end) if st == 200]
            split = gaps_by_phase(ends, t0, end, load_phases(r["t1"], r["timings"] or {}) + freed)
            r.update(split, own_ratio=split["own_gap_s"] / r["slower_steady_s"],
                     quiet_ratio=split["quiet_gap_s"] / r["slower_steady_s"])
            print(f"  switch to {r['target']}: own {split['own_gap_s'] * 1000:.1f} ms ({r['own_ratio']:.2f}x, "
                  f"{'+'.join(split['own_phases']) or '-'}, from {split['own_from_s'] * 1000:.0f} ms); quiet "
                  f"{split['quiet_gap_s'] * 1000:.1f} ms ({r['quiet_ratio']:.2f}x)", flush=True)
        steady_lat = [end - start for start, end, st in steady if st == 200]
        lat_during = [x for r in results for x in r["latencies"]]
        return {
            "policy": policy, "switches": switches, "effective_policy": sorted({r["policy"] for r in results}),
            "steady_gap_ms": steady_gap * 1000,
            "max_gap_ms_median": statistics.median(r["max_gap_s"] for r in results) * 1000,
            "max_gap_ms_worst": max(r["max_gap_s"] for r in results) * 1000,
            "free_ms": free_ms, "free_parts": free_parts, "engine_config": config, "cache_prompt": cache_prompt,
            "engine_log": slow_turns,
            "switches_detail": [{k: v for k, v in r.items() if k not in ("latencies", "windows")} for r in results],
            "steady_gap_ms_of": {m: round(g * 1000, 2) for m, g in steady_of.items()},
            "ratio_slower_median": statistics.median(r["ratio_slower"] for r in results),
            "ratio_slower_worst": max(r["ratio_slower"] for r in results),
            "control_ratio_median": statistics.median(r["control_ratio"] for r in results),
            "control_ratio_worst": max(r["control_ratio"] for r in results),
            "own_ratio_median": statistics.median(r["own_ratio"] for r in results),
            "own_ratio_worst": max(r["own_ratio"] for r in results),
            "quiet_ratio_worst": max(r["quiet_ratio"] for r in results),
            "outside_ms_steady": base_outside,
            "server_ratio_median": statistics.median(r["server_ratio"] for r in results),
            "server_ratio_worst": max(r["server_ratio"] for r in results),
            "control_server_ratio_worst": max(r["control_server_ratio"] for r in results),
            "load_ms_median": statistics.median(r["load_s"] for r in results) * 1000,
            "failed": sum(r["failed"] for r in results),
            "p50_ms_steady": pct(steady_lat, 0.5) * 1000, "p99_ms_steady": pct(steady_lat, 0.99) * 1000,
            "p50_ms_switch": pct(lat_during, 0.5) * 1000, "p99_ms_switch": pct(lat_during, 0.99) * 1000,
            **({"gil_holders": gil} if gil_profile else {}),
        }
    finally:
        if sampler is not None:
            sampler.stop()
        if holders is not None:
            holders.stop()
        e.stop()


def _gpus() -> str:
    import shutil
    if not shutil.which("nvidia-smi"):
        return "no GPU"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20).stdout.split("\n")
    return "GPU: " + ", ".join(x.strip() for x in out if x.strip()) + " (every layer offloaded)"


def markdown(rows: list[dict[str, Any]], cmd: str, models: tuple[str, ...] = MODELS) -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    import os
    out = [f"## Reload unavailability ({time.strftime('%Y-%m-%d')})", "",
           f"Command: `{cmd}`  ", f"Machine: {cpu}, {os.cpu_count()} cores, {_gpus()}. Switches {models[1]} ↔ "
           f"{models[0]} under a steady one-at-a-time client (4-token completions).", "",
           "| policy | steady gap ms (each model) | max gap ms (median / worst) | gap ÷ slower model's steady gap "
           "(median / worst) | in the switch's own phases (median / worst) | in its quiet rest (worst) "
           "| the same, a window as long with no switch (median / worst) "
           "| with the time outside the engine's handler at its steady median (median / worst; control worst) "
           "| gap ÷ first model's "
           "steady gap | load ms (engine) | gap − load ms | "
           "failed | p50 ms steady / switch | p99 ms steady / switch | old model freed in ms (median, off the step loop) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        each = " / ".join(f"{g:.1f}" for g in r["steady_gap_ms_of"].values())
        variant = f" `{json.dumps(r['engine_config'])}`" if r.get("engine_config") else ""
        out.append(f"| {r['policy']}{variant} | {each} | {r['max_gap_ms_median']:.1f} / {r['max_gap_ms_worst']:.1f} "
                   f"| **{r['ratio_slower_median']:.2f}** / {r['ratio_slower_worst']:.2f} "
                   f"| {r['own_ratio_median']:.2f} / {r['own_ratio_worst']:.2f} | {r['quiet_ratio_worst']:.2f} "
                   f"| {r['control_ratio_median']:.2f} / {r['control_ratio_worst']:.2f} "
                   f"| {r['server_ratio_median']:.2f} / {r['server_ratio_worst']:.2f}; "
                   f"{r['control_server_ratio_worst']:.2f} "
                   f"| {r['max_gap_ms_median'] / r['steady_gap_ms']:.2f} | {r['load_ms_median']:.0f} | "
                   f"{r['max_gap_ms_median'] - r['load_ms_median']:.0f} | {r['failed']} | "
                   f"{r['p50_ms_steady']:.1f} / {r['p50_ms_switch']:.1f} | {r['p99_ms_steady']:.1f} / {r['p99_ms_switch']:.1f} | "
                   f"{statistics.median(r['free_ms']) if r['free_ms'] else float('nan'):.1f} |")
    out += ["", "Steady gaps are each model's own, measured while it alone serves (the first before any switch, "
            "the other after its first switch). A switch's own phases are its load's parts (weights, context, "
            f"warm-up, install: the engine's timings), {FIRST_TURNS_S * 1000:.0f} ms of the new generation's first turns "
            f"and each part of the old one's paced free (+{FREE_TAIL_S * 1000:.0f} ms); a gap that overlaps none of them "
            "lies in the switch's quiet rest. The control is each switch's window again, as long, right after it "
            "(the new model serving alone, the old one freed): what the host's own jitter puts in a window that "
            "long. Every answer's `timings.server_ms` says how long its request was in the engine's HTTP "
            "handler; the rest of the client's time for it is the HTTP layer, the network and the client. With "
            "that rest held at its steady median, a gap shows only what the engine did. Goals: overlap gap ≤ 1.5× steady gap (of the slower model); "
            "drain gap ≤ load time + 500 ms; 0 failed requests; "
            "overlap p99 during a switch ≤ 1.5× steady.", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switches", type=int, default=6, help="model switches per policy (alternating)")
    ap.add_argument("--policies", default="overlap,drain")
    ap.add_argument("--models", default=",".join(MODELS), help="the two models switched between (aliases or GGUF "
                    "paths; the second is loaded first)")
    ap.add_argument("--slow-loop-ms", type=float, default=0.0, metavar="MS",
                    help="the engine logs each time its event loop took longer than this to run a callback "
                         "(logging.slow_loop_ms, at least 1), with where the loop was; each switch's longest gap "
                         "lists those that overlap it")
    ap.add_argument("--slow-turn-ms", type=float, default=0.0, help="the engine logs each turn of its loop longer "
                    "than this (logging.slow_turn_ms); the lines go into the JSON (engine_log)")
    ap.add_argument("--engine-configs", type=json.loads, default=[{}], metavar="JSON",
                    help="a list of engine YAML variants to run each policy with, e.g. "
                         "'[{}, {\"reaper\": {\"pause_ms\": 100}}]'; a variant's \"defaults\" adds runtime parameters, "
                         "e.g. '{\"defaults\": {\"n_threads\": 4}}' (default: [{}], the defaults)")
    ap.add_argument("--no-cache-prompt", action="store_true",
                    help="the client sends cache_prompt: false, so no request reuses its slot's KV (see above)")
    ap.add_argument("--blocked", type=float, default=0.0, metavar="MS",
                    help="sample which of the engine's threads sit in which system call (scripts/sample_blocked.py) "
                         "and report, per switch, the calls of MS or longer within its longest gap (needs the right "
                         "to trace the engine: root or ptrace allowed)")
    ap.add_argument("--gil-profile", action="store_true",
                    help="record which of the engine's threads held the interpreter lock, in which code, over each "
                         "variant's run (scripts/gil_holders.py: py-spy, from the test extras; the right to trace "
                         "the engine as for --blocked)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--markdown", action="store_true", help="accepted for older command lines: the tables are printed as markdown either way "
                    "(docs/benchmarks.md is not written)")
    args = ap.parse_args()
    named = tuple(args.models.split(","))
    # a GGUF path is handed to the engine absolute: it resolves a relative one under its models directory
    models = tuple(str(Path(m).resolve()) if m.endswith(".gguf") and Path(m).is_file() else m for m in named)
    if len(models) != 2:
        raise SystemExit("--models takes two models")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            for config in args.engine_configs:
                rows.append(run_policy(policy, args.switches, Path(tmp), models, args.slow_turn_ms, config,
                                       cache_prompt=not args.no_cache_prompt, blocked_ms=args.blocked,
                                       gil_profile=args.gil_profile, slow_loop_ms=args.slow_loop_ms))
                print(json.dumps(rows[-1]), flush=True)
    cmd = "scripts/bench_reload.py " + " ".join(sys.argv[1:])
    text = markdown(rows, ".venv/bin/python " + cmd.strip(), named)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

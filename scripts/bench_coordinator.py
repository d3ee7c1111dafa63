#!/usr/bin/env python3
"""What the coordinator costs: the same streams straight to an engine and through hydra-coordinator.

A real ``hydra-coordinator`` and one real ``hydrad`` (SmolLM2-135M, 8 slots) on loopback, the
engine joined to the coordinator's bus. Streamed ``POST /v1/completions`` (temperature 0,
``ignore_eos``, prompt caching off, a fresh random prefix on every prompt so each request
prefills its whole prompt) are sent in alternating pairs of batches: straight to the engine's
HTTP port, then through the coordinator's front door (the order flips every run), at 1 and at 8
concurrent streams. Measured by this client:

- TTFT: request sent → first streamed token. Added latency = through − direct, at p50 and p99
  (goal: p50 ≤ 2 ms).
- Streaming tok/s per stream: (tokens − 1) / (last token − first token); ratio through ÷ direct
  of the medians (goal ≥ 0.99), and for 8 streams the aggregate tok/s too.

And, with the engine's work held constant (``--overhead-pairs``): one-token streamed requests of
one short prompt, cached after its first request, one at a time, alternating direct and through.
Prefill noise is gone from these, so their TTFT difference is the coordinator's own latency: the
HTTP hop, routing, the bus both ways.

Then, in this process, the time of one routing decision: ``routing.route`` over 8 synthetic
``EngineView``s (mixed stages and models, 1,000 sessions and prefixes each) for a request with a
4K-token prompt (goal: p99 ≤ 2 ms); and the whole per-request routing work of the front door
(token estimate of the 16K-character conversation, its prefix hash, ``route``).

    .venv/bin/python scripts/bench_coordinator.py --runs 10
    .venv/bin/python scripts/bench_coordinator.py --runs 10 --bus-only   # requests over the bus, not beside it
    .venv/bin/python scripts/bench_coordinator.py --runs 20 --markdown     # a section for docs/benchmarks.md
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from hydrad.common import heap  # noqa: E402
from tests.support.coordinator import Coordinator  # noqa: E402
from tests.support.engine import SMOLLM, Engine, models_dir  # noqa: E402

MODEL = "smollm2-135m"
WORDS = ("the river carries light stone across a quiet valley where old towers watch the road and every "
         "traveller counts the bridges before night falls on the hills").split()


# ----- streams -----------------------------------------------------------------------------

@dataclass
class Stream:
    t_send: float
    t_first: float = 0.0  # first event with text
    t_last: float = 0.0  # last event with text
    tokens: int = 0  # completion tokens the server reports
    events: int = 0  # events with text


def prompt(n_words: int) -> str:
    nonce = "".join(random.choices(string.ascii_lowercase, k=12))  # no two prompts share a prefix
    return f"[{nonce}] " + " ".join(random.choice(WORDS) for _ in range(n_words))


async def one_stream(client: httpx.AsyncClient, base: str, payload: dict[str, Any]) -> Stream:
    st = Stream(time.perf_counter())
    async with client.stream("POST", base + "/v1/completions", json=payload) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            if line == "data: [DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"{base}: stream error {ev['error']}")
            choices = ev.get("choices") or []
            if choices and choices[0].get("text"):
                st.events += 1
                st.t_last = now
                if not st.t_first:
                    st.t_first = now
            if ev.get("usage"):
                st.tokens = int(ev["usage"].get("completion_tokens") or 0)
    return st


async def batch(base: str, n: int, tokens: int, prompt_words: int, kept: bool = False) -> tuple[float, list[Stream]]:
    """``n`` streams at once, each on its own connection: opened for the batch (a client without
    keep-alive), or with ``kept`` opened before it by an untimed one-token request each (a client
    that keeps its connections, as an SDK does)."""
    payloads = [{"prompt": prompt(prompt_words), "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                 "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": False}
                for _ in range(n)]
    limits = httpx.Limits(max_connections=n + 2, max_keepalive_connections=n + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10), limits=limits) as client:
        if kept:
            await asyncio.gather(*(one_stream(client, base, dict(p, prompt=prompt(prompt_words), max_tokens=1))
                                   for p in payloads))
        t0 = time.perf_counter()
        streams = await asyncio.gather(*(one_stream(client, base, p) for p in payloads))
        wall = time.perf_counter() - t0
    for st in streams:
        if st.tokens != tokens:
            raise RuntimeError(f"{base}: a stream generated {st.tokens} tokens, expected {tokens}")
    return wall, list(streams)


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux), 0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(direct: str, through: str, concurrency: int, runs: int, tokens: int, prompt_words: int,
            coordinator_pid: int, kept: bool = False) -> dict[str, Any]:
    rows: dict[str, dict[str, list[float]]] = {p: {"ttft_ms": [], "tps": [], "aggregate": []}
                                               for p in ("direct", "through")}
    paired: list[float] = []  # per run: median TTFT through − direct, the two batches back to back
    coord_cpu, relayed = 0.0, 0  # the coordinator's CPU time while it relayed, and the tokens it relayed
    for run in range(runs):
        order = [("direct", direct), ("through", through)]
        if run % 2:
            order.reverse()
        for path, base in order:
            cpu0 = cpu_seconds(coordinator_pid)
            with heap.paused():
                wall, streams = asyncio.run(batch(base, concurrency, tokens, prompt_words, kept))
            if path == "through":
                coord_cpu += cpu_seconds(coordinator_pid) - cpu0
                relayed += sum(st.tokens for st in streams)
            r = rows[path]
            r["ttft_ms"] += [(st.t_first - st.t_send) * 1000 for st in streams]
            r["tps"] += [(st.tokens - 1) / (st.t_last - st.t_first) for st in streams if st.t_last > st.t_first]
            r["aggregate"].append(sum(st.tokens for st in streams) / wall)
        d, t = rows["direct"], rows["through"]
        paired.append(statistics.median(t["ttft_ms"][-concurrency:]) - statistics.median(d["ttft_ms"][-concurrency:]))
        print(f"  {concurrency} stream(s), run {run + 1}/{runs}: TTFT p50 direct {pct(d['ttft_ms'][-concurrency:], .5):.1f} ms"
              f" / through {pct(t['ttft_ms'][-concurrency:], .5):.1f} ms; tok/s direct "
              f"{statistics.median(d['tps'][-concurrency:]):.1f} / through {statistics.median(t['tps'][-concurrency:]):.1f}",
              flush=True)
    out: dict[str, Any] = {"concurrency": concurrency, "runs": runs, "samples": len(rows["direct"]["ttft_ms"]),
                           "connections": "kept" if kept else "fresh"}
    for path, r in rows.items():
        out[path] = {"ttft_p50_ms": pct(r["ttft_ms"], .5), "ttft_p99_ms": pct(r["ttft_ms"], .99),
                     "tps_median": statistics.median(r["tps"]), "aggregate_median": statistics.median(r["aggregate"])}
    d, t = out["direct"], out["through"]
    out["added_p50_ms"] = t["ttft_p50_ms"] - d["ttft_p50_ms"]
    out["added_p99_ms"] = t["ttft_p99_ms"] - d["ttft_p99_ms"]
    out["added_paired_median_ms"] = statistics.median(paired)
    out["coordinator_cpu_ms_per_token"] = coord_cpu * 1000 / relayed if relayed else float("nan")
    out["tps_ratio"] = t["tps_median"] / d["tps_median"]
    out["aggregate_ratio"] = t["aggregate_median"] / d["aggregate_median"]
    return out


async def _first_token_ms(client: httpx.AsyncClient, base: str, payload: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    first = 0.0
    async with client.stream("POST", base + "/v1/completions", json=payload) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not first and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = time.perf_counter()
    if not first:
        raise RuntimeError(f"{base}: the stream carried no text")
    return (first - t0) * 1000


async def overhead_pairs(direct: str, through: str, pairs: int) -> dict[str, Any]:
    """TTFT with the engine's work held constant: the same short prompt, cached after the first
    request, one token, one request at a time, alternating direct and through (the order flips
    every pair). What is left of TTFT is HTTP, the bus and the engine's scheduling, so the
    difference is the coordinator's own latency, not prefill noise."""
    payload = {"prompt": "The coordinator adds", "max_tokens": 1, "temperature": 0, "ignore_eos": True,
               "stream": True, "cache_prompt": True}
    rows: dict[str, list[float]] = {"direct": [], "through": []}
    diffs: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=10)) as cd, \
            httpx.AsyncClient(timeout=httpx.Timeout(60, connect=10)) as ct:
        paths = {"direct": (cd, direct), "through": (ct, through)}
        for _ in range(20):  # warm: connections, the prompt's KV, both event loops
            for client, base in paths.values():
                await _first_token_ms(client, base, payload)
        for i in range(pairs):
            order = ["direct", "through"] if i % 2 == 0 else ["through", "direct"]
            got = {}
            for path in order:
                client, base = paths[path]
                got[path] = await _first_token_ms(client, base, payload)
                rows[path].append(got[path])
            diffs.append(got["through"] - got["direct"])
    out: dict[str, Any] = {"pairs": pairs}
    for path, xs in rows.items():
        out[path] = {"ttft_p50_ms": pct(xs, .5), "ttft_p99_ms": pct(xs, .99)}
    out["added_p50_ms"] = out["through"]["ttft_p50_ms"] - out["direct"]["ttft_p50_ms"]
    out["added_p99_ms"] = out["through"]["ttft_p99_ms"] - out["direct"]["ttft_p99_ms"]
    out["added_paired_median_ms"] = statistics.median(diffs)
    return out


# ----- routing, in process -----------------------------------------------------------------

def routing_bench(iterations: int) -> dict[str, Any]:
    from hydrad.coordinator.affinity import prefix_of
    from hydrad.coordinator.frontdoor import _estimate_tokens
    from hydrad.coordinator.routing import EngineView, ModelSpec, RouteRequest, route
    from hydrad.wire import openai
    from hydrad.common.registry import Registry

    registry = Registry.load(REPO / "etc" / "hydra" / "models.yaml", models_dir())
    specs = {alias: ModelSpec.from_entry(alias, e) for alias, e in registry.entries.items()}
    models = list(specs)
    rng = random.Random(7)
    views = []
    for i in range(8):
        stage = ["ready", "ready", "ready", "ready", "ready", "reloading", "loading_model", "idle"][i]
        model = None if stage == "idle" else models[i % len(models)]
        views.append(EngineView(
            name=f"gpu{i}", alive=True, stage=stage, model=model, models_on_disk=frozenset(models),
            slots_busy=rng.randrange(0, 9), slots_total=8 if model else 0, queued=rng.randrange(0, 4), max_queue=64,
            vram_total=(8 + 4 * i) << 30, vram_free=(2 + i) << 30, gpu_arch=["sm_61", "sm_86", "sm_89", "sm_120"][i % 4],
            prefill_tps=rng.uniform(2000, 20000), decode_tps=rng.uniform(40, 200), load_seconds=rng.uniform(0.5, 5),
            sessions=frozenset(f"s{i}-{k}" for k in range(1000)),
            cached_prefixes=frozenset(f"{rng.getrandbits(64):016x}" for _ in range(1000))))
    # A conversation of about 4K tokens (16K characters in 8 turns); the session lives on gpu2.
    turns = [{"role": "user" if k % 2 == 0 else "assistant", "content": prompt(450)[:2048]} for k in range(8)]
    raw = json.dumps({"model": models[0], "messages": turns, "max_tokens": 256, "session_id": "s2-500"}).encode()
    _, greq = openai.parse("chat", raw)
    rr = RouteRequest(model=models[0], prompt_tokens=_estimate_tokens(greq), max_tokens=256, session_id="s2-500",
                      prefix_hash=prefix_of(greq.messages), n_ctx=8192)
    decision = route(rr, views, specs)

    def timed(fn: Any) -> list[float]:
        for _ in range(200):
            fn()
        out = []
        for _ in range(iterations):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    only = timed(lambda: route(rr, views, specs))

    def front_door() -> None:
        r = RouteRequest(model=models[0], prompt_tokens=_estimate_tokens(greq), max_tokens=256, session_id="s2-500",
                         prefix_hash=prefix_of(greq.messages), n_ctx=8192)
        route(r, views, specs)
    whole = timed(front_door)
    return {"iterations": iterations, "prompt_tokens": rr.prompt_tokens, "decision": decision.public()["engine"],
            "step": decision.step, "engines": len(views),
            "route_p50_ms": pct(only, .5), "route_p99_ms": pct(only, .99), "route_max_ms": max(only),
            "front_p50_ms": pct(whole, .5), "front_p99_ms": pct(whole, .99), "front_max_ms": max(whole)}


# ----- report ------------------------------------------------------------------------------

def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _ok(flag: bool) -> str:
    return "met" if flag else "**missed**"


def markdown(args: argparse.Namespace, streams: list[dict[str, Any]], overhead: dict[str, Any] | None,
             routing: dict[str, Any], started: str,
             loads: tuple[str, str]) -> str:
    argv, shown = sys.argv[1:], []
    while argv:  # the command as run, less --json FILE (a path of this machine, not part of the method)
        a = argv.pop(0)
        if a == "--json":
            argv = argv[1:]
        elif not a.startswith("--json="):
            shown.append(a)
    cmd = " ".join(["scripts/bench_coordinator.py", *shown])
    lines = [
        f"## Coordinator overhead ({started})", "",
        f"Command: `.venv/bin/python {cmd}`  ",
        f"Machine: {machine()}; load average {loads[0]} at the start, {loads[1]} at the end (other work shares "
        "the machine).  ",
        f"One hydrad (SmolLM2-135M, 8 slots, n_threads {args.threads}) on the bus of one hydra-coordinator, both on "
        f"loopback. Streamed `/v1/completions` of about {args.prompt_words + 4} prompt words and {args.tokens} "
        "generated tokens (temperature 0, `ignore_eos`, prompt caching off, a fresh prefix per prompt), in "
        "alternating batches straight to the engine and through the coordinator; the order flips every run.", "",
        "| streams | runs (samples) | TTFT p50 direct / through | added p50 | added, median of pairs "
        "| TTFT p99 direct / through | added p99 | tok/s per stream direct / through | ratio | aggregate ratio "
        "| coordinator CPU per token |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in streams:
        d, t = s["direct"], s["through"]
        lines.append(
            f"| {s['concurrency']} | {s['runs']} ({s['samples']}) | {d['ttft_p50_ms']:.1f} / {t['ttft_p50_ms']:.1f} ms "
            f"| {s['added_p50_ms']:+.2f} ms | {s['added_paired_median_ms']:+.2f} ms "
            f"| {d['ttft_p99_ms']:.1f} / {t['ttft_p99_ms']:.1f} ms "
            f"| {s['added_p99_ms']:+.2f} ms | {d['tps_median']:.1f} / {t['tps_median']:.1f} | {s['tps_ratio']:.3f} "
            f"| {s['aggregate_ratio']:.3f} | {s['coordinator_cpu_ms_per_token']:.2f} ms |")
    r = routing
    if overhead is not None:
        o = overhead
        lines += [
            "",
            f"Added latency with the engine's work held constant ({o['pairs']} pairs, one request at a time, "
            "alternating): the same 3-word prompt, cached after its first request, one streamed token, so TTFT is "
            "HTTP, the bus and scheduling only:", "",
            "| TTFT p50 direct / through | added p50 | added, median of pairs | TTFT p99 direct / through | added p99 |",
            "|---:|---:|---:|---:|---:|",
            f"| {o['direct']['ttft_p50_ms']:.2f} / {o['through']['ttft_p50_ms']:.2f} ms | {o['added_p50_ms']:+.2f} ms "
            f"| {o['added_paired_median_ms']:+.2f} ms | {o['direct']['ttft_p99_ms']:.2f} / "
            f"{o['through']['ttft_p99_ms']:.2f} ms | {o['added_p99_ms']:+.2f} ms |",
        ]
    lines += [
        "",
        "TTFT is request sent → first streamed token; tok/s per stream is (tokens − 1) / (last token − first "
        "token), medians over all streams; the aggregate is all tokens of a batch ÷ its wall time. \"Median of "
        "pairs\" compares batches sent back to back, which drift on a shared machine cancels out of. With a load "
        "average above the core count, differences of a few ms and a few percent are within run-to-run noise, and "
        "the coordinator's own CPU time (last column: its user + system time while relaying ÷ tokens relayed) is "
        "taken from the engine's share of the cores.",
        "",
        f"Routing, in process ({r['iterations']} decisions; {r['engines']} synthetic engines with mixed stages, models "
        f"and GPU architectures, 1,000 sessions and 1,000 prefixes each; a chat request of ~{r['prompt_tokens']} "
        f"prompt tokens whose session is warm on one engine, decided by `{r['step']}`):", "",
        "| work | p50 | p99 | max |", "|---|---:|---:|---:|",
        f"| `routing.route` | {r['route_p50_ms'] * 1000:.0f} µs | {r['route_p99_ms'] * 1000:.0f} µs "
        f"| {r['route_max_ms'] * 1000:.0f} µs |",
        f"| token estimate + prefix hash + `route` | {r['front_p50_ms'] * 1000:.0f} µs | {r['front_p99_ms'] * 1000:.0f} µs "
        f"| {r['front_max_ms'] * 1000:.0f} µs |",
        "",
        "Goals: added TTFT p50 ≤ 2 ms: " + ", ".join(
            ([f"constant work {_ok(overhead['added_p50_ms'] <= 2.0)}"] if overhead is not None else [])
            + [f"{s['concurrency']} stream(s) {_ok(s['added_p50_ms'] <= 2.0)}" for s in streams])
        + "; streaming tok/s through ÷ direct ≥ 0.99: " + ", ".join(
            f"{s['concurrency']} stream(s) {_ok(s['tps_ratio'] >= 0.99)}" for s in streams)
        + f"; routing decision p99 ≤ 2 ms: {_ok(r['route_p99_ms'] <= 2.0)}.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="pairs of batches per concurrency (default 10)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per stream (default 32)")
    ap.add_argument("--prompt-words", type=int, default=16,
                    help="words of each prompt (default 16: a short prefill keeps TTFT's noise small)")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated stream counts (default 1,8)")
    ap.add_argument("--kept-connections", action="store_true",
                    help="open each batch's connections before timing it (a client with keep-alive); default: "
                         "every stream opens its connection inside the timed batch")
    ap.add_argument("--threads", type=int, default=1,
                    help="engine n_threads (default 1: the other cores stay for the coordinator and this client)")
    ap.add_argument("--overhead-pairs", type=int, default=300,
                    help="pairs of one-token requests on a cached prompt, for the added latency alone "
                         "(default 300; 0 skips)")
    ap.add_argument("--route-iterations", type=int, default=20000, help="routing decisions timed (default 20000)")
    ap.add_argument("--bus-only", action="store_true",
                    help="requests go over the ZeroMQ bus (bus.request_stream: off); default: on the request stream, "
                         "as in a default pool")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md (it does not write the file)")
    args = ap.parse_args()
    if not (models_dir() / SMOLLM).is_file():
        raise SystemExit(f"{models_dir() / SMOLLM} is missing (scripts/setup fetches it)")
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = loadavg()
    print("routing decisions, in process ...", flush=True)
    routing = routing_bench(args.route_iterations)
    print(f"  route p50 {routing['route_p50_ms'] * 1000:.0f} µs, p99 {routing['route_p99_ms'] * 1000:.0f} µs; "
          f"front-door routing work p99 {routing['front_p99_ms'] * 1000:.0f} µs", flush=True)
    streams: list[dict[str, Any]] = []
    overhead: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="hydra-bench-coord-") as tmp:
        c = Coordinator(Path(tmp), heartbeat_interval_s=1.0, extra={"first_token_timeout_s": 300, "token_timeout_s": 120},
                        request_stream=not args.bus_only)
        e = None
        try:
            c.wait_ready()
            e = Engine(Path(tmp), name="bench",
                       defaults={"model": MODEL, "n_parallel": 8, "n_ctx": 8192, "n_threads": args.threads,
                                 "temperature": 0},
                       extra={"bus": c.engine_bus(heartbeat_interval_s=1.0), "max_queue": 64})
            e.wait_ready(120)
            c.wait_serving({"bench": MODEL}, 60)
            print(f"engine {e.url}, coordinator {c.url}; warming up ...", flush=True)
            for base in (e.url, c.url):
                asyncio.run(batch(base, 2, 8, args.prompt_words))
            if args.overhead_pairs:
                print(f"added latency with constant engine work, {args.overhead_pairs} pairs ...", flush=True)
                with heap.paused():
                    overhead = asyncio.run(overhead_pairs(e.url, c.url, args.overhead_pairs))
                print(f"  TTFT p50 direct {overhead['direct']['ttft_p50_ms']:.2f} ms / through "
                      f"{overhead['through']['ttft_p50_ms']:.2f} ms (added {overhead['added_p50_ms']:+.2f} ms, "
                      f"p99 {overhead['added_p99_ms']:+.2f} ms)", flush=True)
            for n in (int(x) for x in args.concurrency.split(",")):
                print(f"{n} concurrent stream(s), {args.runs} runs ...", flush=True)
                streams.append(measure(e.url, c.url, n, args.runs, args.tokens, args.prompt_words, c.proc.pid,
                                       args.kept_connections))
        finally:
            if e is not None:
                e.stop()
            c.stop()
    loads = (load_start, loadavg())
    for s in streams:
        d, t = s["direct"], s["through"]
        print(f"{s['concurrency']} stream(s): TTFT p50 {d['ttft_p50_ms']:.2f} → {t['ttft_p50_ms']:.2f} ms "
              f"(added {s['added_p50_ms']:+.2f} ms, median of pairs {s['added_paired_median_ms']:+.2f} ms), p99 {d['ttft_p99_ms']:.2f} → {t['ttft_p99_ms']:.2f} ms "
              f"(added {s['added_p99_ms']:+.2f} ms); tok/s {d['tps_median']:.1f} → {t['tps_median']:.1f} "
              f"(ratio {s['tps_ratio']:.3f}, aggregate {s['aggregate_ratio']:.3f}); coordinator CPU "
              f"{s['coordinator_cpu_ms_per_token']:.2f} ms per token")
    print(f"routing: route p99 {routing['route_p99_ms'] * 1000:.0f} µs (goal ≤ 2000 µs); "
          f"with estimate and prefix hash p99 {routing['front_p99_ms'] * 1000:.0f} µs")
    if args.json:
        Path(args.json).write_text(json.dumps({"streams": streams, "overhead": overhead, "routing": routing,
                                               "machine": machine(),
                                               "load": loads, "started": started}, indent=2))
    if args.markdown:
        print("\n" + markdown(args, streams, overhead, routing, started, loads), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

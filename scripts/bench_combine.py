#!/usr/bin/env python3
"""COMBINE through a peer engine's merged port vs the same head on llama.cpp's stock ggml RPC server.

One run of this script starts three processes on loopback: a *peer* hydrad without a model,
lending its CPU over its merged port (relay → in-process ggml RPC server, tensor cache on); a
*stock* ggml RPC server (llama.cpp's own, in a process of its own, nothing in front: the
yardstick, as in tests/integration/test_combine.py); and a *head* hydrad that loads SmolLM2-135M
with a 50/50 layer split (``tensor_split: [0.5, 0.5]``: on a GPU-less head the first share is the
head's own CPU, see hydrad/engine/placement.py). Peer compute threads, the stock server's threads
and the head's ``n_threads`` are all ``--threads``.

1. Layer split. Per run the head is configured three ways (a reload each): the Hydra peer in
   ``rpc_servers``, the stock server in ``rpc_servers`` (same split), and SOLO (no
   ``rpc_servers``); the order alternates from run to run (SOLO, stock, Hydra; then Hydra, stock,
   SOLO; ...), so every measured configuration is freshly loaded. After each load one short
   warm-up request; then one measured request: ``POST /v1/completions``,
   streamed, ``temperature 0``, ``ignore_eos``, ``cache_prompt: false``, a prompt of exactly
   ``--prompt-tokens`` tokens with a fresh random prefix per run (the same prompt for the three
   configurations of one run), ``--tokens`` generated. Prefill tok/s = prompt tokens ÷ TTFT,
   decode tok/s = (tokens - 1) ÷ (last token - first token), on the client's clock (the engine's
   ``timings`` are recorded in the JSON too, but on a head with an RPC peer they split prefill
   and decode at the wrong moment: see :func:`complete`). Medians, Hydra ÷ stock (goal ≥ 0.95)
   and both ÷ SOLO; the greedy pieces of the Hydra-peer and stock-peer runs are compared run by
   run. The peer relay's command counter over each Hydra-peer request gives ggml-RPC commands
   per token, and with the pairs' decode times the relay hop's cost per command.
2. Bytes on the wire. Before the runs: the first load of the model onto the (fresh) peer and,
   after ``{"model": null}``, a second load of the same; the peer's relay counters
   (``weight_bytes`` uploaded with SET_TENSOR, ``cache_hits``/``cache_hit_bytes`` of tensors
   offered by hash that its tensor cache held, ``cache_misses``) before/after each, and the load
   seconds of each (the load record of ``/control/configure?wait=1``).
3. Expert split (``--moe``, default on; about half a minute): a tiny MoE made by
   scripts/make_tiny_moe.py, the experts (``\\.ffn_(up|down|gate)_exps=RPC``) on the peer,
   everything else on the head (``tensor_split: [1.0, 0.0]``); the same alternation, but
   ``--moe-repeat`` measured requests per load (the model is so small that one request takes a
   few milliseconds of prefill and well under a second of decode), the run's figure their median.

    .venv/bin/python scripts/bench_combine.py --runs 5 --tokens 64 --markdown --json combine.json

``--markdown`` prints a section for docs/benchmarks.md (it does not write the file).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_engine import (CpuGuard, PromptMaker, Tokenizer, describe_machine, display_path,  # noqa: E402
                          git_describe, machine)
from tests.support.engine import SMOLLM, Engine, free_port, models_dir, terminate  # noqa: E402
from tests.support.wait import eventually  # noqa: E402

from hydrad.wire.rpcclient import RpcClient  # noqa: E402

MODEL = "smollm2-135m"
SPLIT = [0.5, 0.5]
EXPERTS = [r"\.ffn_(up|down|gate)_exps=RPC"]
STOCK = REPO / "tests" / "support" / "stock_ggml_rpc.py"
# tests/support/stock_ggml_rpc.py with a thread count (that file runs one thread)
STOCK_THREADS = ("import sys, time\nfrom hydrad.engine import ggml\n"
                 "s = ggml.RpcServerThread('127.0.0.1', int(sys.argv[1]), None, int(sys.argv[2]))\ns.start()\n"
                 "while s.alive:\n    time.sleep(0.2)\nsys.exit(s.error or 'the ggml RPC server stopped')\n")
SIDES = ("hydra", "direct", "stock", "solo")
LABEL = {"hydra": "Hydra peer, relay (merged port)", "direct": "Hydra peer, direct line (merged port)",
         "stock": "stock ggml RPC server", "solo": "SOLO (no peer)"}
SHORT = {"hydra": "H", "direct": "D", "stock": "S", "solo": "O"}
SINGLE_THREAD_ENV = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


# ----- the three processes ------------------------------------------------------------------


def rpc_port(engine: Engine) -> int:
    return int(yaml.safe_load(engine.config.read_text())["rpc"]["port"])


def relay_stats(engine: Engine) -> dict[str, Any]:
    with RpcClient(("127.0.0.1", rpc_port(engine))) as c:
        return c.info()["rpc"]["ggml_relay"]


def start_stock(threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, str(STOCK), str(port)] if threads == 1 else \
        [sys.executable, "-c", STOCK_THREADS, str(port), str(threads)]
    proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, **SINGLE_THREAD_ENV))

    def up() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"bench: the stock ggml RPC server exited with {proc.returncode}")
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    eventually(up, 30, "the stock ggml RPC server", ignore=(OSError,))
    return proc, f"127.0.0.1:{port}"


def configure(engine: Engine, **payload: Any) -> dict[str, Any]:
    r = engine.configure(**payload)
    if r.status_code != 200:
        raise SystemExit(f"bench: configure {payload} answered {r.status_code}: {r.text[:1000]}")
    body = r.json()
    if "load" in body and body["load"]["phase"] != "done":  # no load record: nothing changed, no reload
        raise SystemExit(f"bench: load did not finish: {body}")
    return body


def load_seconds(body: dict[str, Any]) -> float | None:
    rec = body.get("load")
    return None if rec is None else float(rec["timings"].get("load_s", rec["seconds"]))


# ----- one measured request -----------------------------------------------------------------


def complete(engine: Engine, prompt: str, n: int) -> dict[str, Any]:
    """A streamed greedy completion: its pieces, the client's timings, and the engine's ``timings``.

    Prefill tok/s = prompt tokens ÷ TTFT (request sent → first token), decode tok/s = (tokens - 1) ÷
    (last token - first token), both on this client's clock. The engine's own ``timings`` are kept
    (``engine_*``) but not used: on a head with an RPC peer llama_decode returns before the peer has
    computed, and the engine stamps the first token before its sample waits for the prefill, so its
    ``prompt_ms`` misses the prefill's tail and ``predicted_ms`` carries it (``first_token_handoff_ms``
    shows how much)."""
    payload = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
               "cache_prompt": False, "stream_options": {"include_usage": True}}
    pieces: list[str] = []
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    t_first = t_last = 0.0
    t0 = time.perf_counter()
    with engine.http.stream("POST", "/v1/completions", json=payload) as r:
        if r.status_code != 200:
            raise SystemExit(f"bench: completion answered {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            ev = json.loads(line[6:])
            if "error" in ev:
                raise SystemExit(f"bench: stream error: {ev['error']}")
            for c in ev.get("choices") or []:
                if c.get("text"):
                    pieces.append(c["text"])
                    t_first = t_first or now
                    t_last = now
            timings = ev.get("timings") or timings
            usage = ev.get("usage") or usage
    t_end = time.perf_counter()
    if not t_first:
        raise SystemExit("bench: the completion streamed no text")
    n_prompt = usage.get("prompt_tokens", timings.get("prompt_n"))
    n_gen = usage.get("completion_tokens", timings.get("predicted_n", len(pieces)))
    ttft = t_first - t0
    pn, pms, dn, dms = (timings.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms"))
    return {"pieces": pieces, "prompt_tokens": n_prompt, "completion_tokens": n_gen, "ttft_ms": ttft * 1000,
            "prefill_tps": n_prompt / ttft if n_prompt else None,
            "decode_tps": (n_gen - 1) / (t_last - t_first) if n_gen > 1 and t_last > t_first else None,
            "wall_ms": (t_end - t0) * 1000, "engine_timings": timings,
            "engine_prefill_tps": pn / (pms / 1000) if pn and pms else None,
            "engine_decode_tps": (dn - 1) / (dms / 1000) if dn and dms and dn > 1 else None}


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def agree(a: list[str], b: list[str]) -> int:
    """How many leading pieces two greedy completions share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def alternate(head: Engine, configs: dict[str, dict[str, Any]], prompts: Callable[[int], str], args: argparse.Namespace,
              guard: CpuGuard, tag: str, log: Callable[[str], None], repeat: int = 1,
              commands: Callable[[], int] | None = None) -> dict[str, Any]:
    """``args.runs`` rounds; each loads the three configurations in turn (order alternating), warms
    up, and measures ``repeat`` requests with that round's prompt (the medians of their figures).
    ``commands`` reads the peer relay's command counter: the Hydra side's ggml-RPC commands per
    measured request are recorded (``relay_commands``)."""
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        order = SIDES[::-1] if i % 2 == 0 else SIDES  # the head holds the Hydra configuration at first
        prompt = prompts(i)
        row: dict[str, Any] = {"run": i + 1, "order": list(order)}
        for side in order:
            body = configure(head, **configs[side])
            complete(head, "Warm-up:", 4)
            reps = []
            for _ in range(repeat):
                c0 = commands() if commands is not None and side == "hydra" else None
                m, foreign = guard.measure(lambda: complete(head, prompt, args.tokens))
                m["foreign_cpu"] = round(foreign, 4)
                if c0 is not None:
                    m["relay_commands"] = commands() - c0
                reps.append(m)
            m = dict(reps[0])
            if repeat > 1:
                for k in ("ttft_ms", "prefill_tps", "decode_tps", "wall_ms", "engine_prefill_tps", "engine_decode_tps",
                          "foreign_cpu"):
                    m[k] = median([x[k] for x in reps])
                m["repeats"] = [{k: v for k, v in x.items() if k != "pieces"} for x in reps]
                m["repeats_identical"] = all(x["pieces"] == reps[0]["pieces"] for x in reps)
                if "relay_commands" in reps[0]:
                    m["relay_commands"] = median([x["relay_commands"] for x in reps])
            m["load_s"] = load_seconds(body)
            row[side] = m
        row["identical"] = row["hydra"]["pieces"] == row["stock"]["pieces"]
        row["direct_identical"] = row["direct"]["pieces"] == row["stock"]["pieces"]
        row["solo_agree"] = agree(row["solo"]["pieces"], row["hydra"]["pieces"])
        runs.append(row)
        log(f"[{tag}] run {i + 1}/{args.runs} ({' '.join(SHORT[s] for s in order)}): " + ", ".join(
            f"{s} prefill {row[s]['prefill_tps']:.0f} decode {row[s]['decode_tps']:.1f}" for s in SIDES)
            + f" tok/s; hydra == stock: {row['identical']}; direct == stock: {row['direct_identical']}")
    return {"runs": runs, "summary": summarize(runs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("prefill_tps", "decode_tps", "ttft_ms", "load_s", "engine_prefill_tps", "engine_decode_tps"):
        med = {s: median([r[s][metric] for r in runs]) for s in SIDES}
        pairs = [r["hydra"][metric] / r["stock"][metric] for r in runs if r["hydra"][metric] and r["stock"][metric]]

        def ratio(a: str, b: str) -> float | None:
            return med[a] / med[b] if med[a] is not None and med[b] else None

        dpairs = [r["direct"][metric] / r["stock"][metric] for r in runs if r["direct"][metric] and r["stock"][metric]]
        out[metric] = {**med, "hydra_over_stock": ratio("hydra", "stock"), "hydra_over_solo": ratio("hydra", "solo"),
                       "direct_over_stock": ratio("direct", "stock"), "direct_pair_median": median(list(dpairs)),
                       "direct_pair_min": min(dpairs) if dpairs else None,
                       "direct_pair_max": max(dpairs) if dpairs else None,
                       "stock_over_solo": ratio("stock", "solo"),
                       "pair_min": min(pairs) if pairs else None, "pair_max": max(pairs) if pairs else None,
                       "pair_median": median(list(pairs)),
                       "per_run": {s: [r[s][metric] for r in runs] for s in SIDES}}
    out["handoff_ms"] = {s: median([r[s]["engine_timings"].get("first_token_handoff_ms") for r in runs])
                         for s in SIDES}
    cmds = [r["hydra"].get("relay_commands") for r in runs]
    if all(c is not None for c in cmds):
        # what the relay's extra hop costs: decode time per token, Hydra peer minus stock peer (the
        # median over the runs' pairs), per ggml-RPC command of a generated token (a request's
        # commands ÷ its tokens: the prefill's few commands are counted in)
        n_gen = median([r["hydra"]["completion_tokens"] for r in runs]) or 1
        per_token = median(cmds) / n_gen
        extra_ms = median([1000 / r["hydra"]["decode_tps"] - 1000 / r["stock"]["decode_tps"] for r in runs
                           if r["hydra"]["decode_tps"] and r["stock"]["decode_tps"]])
        out["relay"] = {"commands_per_request": median(cmds), "commands_per_token": per_token,
                        "extra_ms_per_token": extra_ms,
                        "extra_us_per_command": extra_ms * 1000 / per_token if extra_ms is not None else None}
    out["identical_runs"] = sum(r["identical"] for r in runs)
    out["direct_identical_runs"] = sum(r["direct_identical"] for r in runs)
    out["runs"] = len(runs)
    out["solo_agree_min"] = min(r["solo_agree"] for r in runs)
    out["max_foreign_cpu"] = max(r[s]["foreign_cpu"] for r in runs for s in SIDES)
    return out


# ----- output -------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}"


def _r(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def results_table(s: dict[str, Any], rows: list[tuple[str, str]]) -> str:
    lines = ["| metric (median) | Hydra peer, relay | Hydra peer, direct line | stock ggml RPC server | SOLO (no peer) | "
             "relay ÷ stock (pairs: median, min–max) | direct ÷ stock (pairs: median, min–max) | relay ÷ SOLO | "
             "stock ÷ SOLO |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for metric, label in rows:
        m = s[metric]
        digits = 2 if metric == "load_s" else 1
        lines.append(f"| {label} | {_f(m['hydra'], digits)} | {_f(m['direct'], digits)} | {_f(m['stock'], digits)} | "
                     f"{_f(m['solo'], digits)} | "
                     f"{_r(m['hydra_over_stock'])} ({_r(m['pair_median'])}, {_r(m['pair_min'])}–{_r(m['pair_max'])}) | "
                     f"{_r(m['direct_over_stock'])} ({_r(m['direct_pair_median'])}, {_r(m['direct_pair_min'])}–"
                     f"{_r(m['direct_pair_max'])}) | {_r(m['hydra_over_solo'])} | {_r(m['stock_over_solo'])} |")
    return "\n".join(lines)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def loads_table(loads: dict[str, Any]) -> str:
    lines = ["| load of the model onto the peer | load s | weights uploaded (SET_TENSOR) | found in the peer's tensor "
             "cache by hash | cache misses (offered by hash, uploaded) |", "|---|---:|---:|---:|---:|"]
    for key, label in (("first", "first (fresh peer, empty cache)"), ("second", "second (after `{\"model\": null}`)")):
        d = loads[key]
        lines.append(f"| {label} | {d['load_s']:.2f} | {mib(d['weight_bytes'])} ({d['weight_bytes']:,} B) | "
                     f"{d['cache_hits']} tensor(s), {mib(d['cache_hit_bytes'])} | {d['cache_misses']} |")
    return "\n".join(lines)


def relay_line(s: dict[str, Any]) -> str:
    r = s.get("relay")
    if not r or r["extra_ms_per_token"] is None:
        return ""
    return (f"The relay's hop: a request through the merged port took {r['commands_per_request']:.0f} ggml-RPC "
            f"commands ({r['commands_per_token']:.1f} per generated token); decode took "
            f"{r['extra_ms_per_token']:+.2f} ms per token against the stock peer (median of the runs' pairs), "
            f"{r['extra_us_per_command']:+.0f} µs per command.")


def runs_line(s: dict[str, Any], metric: str) -> str:
    per = s[metric]["per_run"]
    return "; ".join(f"{LABEL[side].split(' (')[0]} {', '.join(_f(v) for v in per[side])}" for side in SIDES)


def gpu_name(machine: dict[str, Any]) -> str:
    """The GPU as nvidia-smi names it ("NVIDIA H100 80GB HBM3"), for the section's title."""
    gpus = machine.get("gpus") or []
    names = sorted({g.split(",")[0].strip() for g in gpus if g.strip()})
    return " + ".join(names) if names else "one"


def markdown(rep: dict[str, Any]) -> str:
    st = rep["settings"]
    lay = rep["layer"]["summary"]
    pl = rep["placement"]
    gpu = any(not d.startswith(("CPU", "RPC")) for d in pl.get("devices", []))
    if gpu:  # head and peer each put their share on the one GPU they both see: a stand-in for two GPUs
        where = f"{gpu_name(rep['machine'])} GPU, head and peer sharing it"
        split = (f"the first share is the head's GPU ({pl['devices'][0]}), the second the peer's, which is the same "
                 f"physical GPU seen by another process: two engines sharing one GPU stand in for two GPUs")
    else:
        where = "CPU"
        split = (f"the first share is the head's CPU: {pl['n_gpu_layers'] - 1} of {pl['n_layer']} layers and the "
                 f"output layer on the peer")
    out = [f"## {rep['date']}: COMBINE (layer split) through the merged port vs stock ggml RPC server, {where}", "",
           f"Command: `{rep['command']}` ({rep['elapsed_s']:.0f} s)", "",
           f"Machine: {describe_machine(rep['machine'])}. hydrad: commit {rep['commit']}.", "",
           f"Settings: {st['model']} ({st['gguf']}), head `tensor_split: {json.dumps(SPLIT)}` ({split}); threads {st['threads']} everywhere (head `n_threads`/`n_threads_batch`, peer "
           f"`rpc.ggml_threads`, the stock server's); head n_ctx {st['n_ctx']}, n_parallel 1. {st['runs']} runs; "
           f"each run loads the head four ways (Hydra peer through the checking relay, a second Hydra peer whose "
           f"`rpc.ggml_direct_from` hands the head to llama.cpp's own server (the direct line), the stock peer, "
           f"SOLO; order alternating), warms up "
           f"and measures one streamed `/v1/completions` request: a {st['prompt_tokens']}-token prompt with a fresh "
           f"prefix per run (the same for the three), {st['tokens']} tokens, `temperature 0`, `ignore_eos`, "
           f"`cache_prompt: false`. Measured on the client's clock: prefill tok/s = prompt tokens ÷ TTFT, "
           f"decode tok/s = (tokens - 1) ÷ (last token - first token); medians. (The engine's own `timings` "
           f"are not used: on a head with an RPC peer `llama_decode` returns before the peer has computed, and "
           f"the engine stamps the first token before its sample waits for the prefill, so `prompt_ms` misses "
           f"the prefill's tail and `predicted_ms` carries it; median `first_token_handoff_ms` here: "
           f"Hydra peer {_f(lay['handoff_ms']['hydra'], 0)} ms, stock peer {_f(lay['handoff_ms']['stock'], 0)} ms, "
           f"SOLO {_f(lay['handoff_ms']['solo'], 0)} ms.)", "",
           results_table(lay, [("prefill_tps", f"prefill tok/s ({st['prompt_tokens']}-token prompt)"),
                               ("decode_tps", f"decode tok/s ({st['tokens']} tokens)"),
                               ("ttft_ms", "TTFT ms (client; lower is better)"),
                               ("load_s", "load s (the reload before the request)")]), "",
           f"Per run, decode tok/s: {runs_line(lay, 'decode_tps')}.  ",
           f"Per run, prefill tok/s: {runs_line(lay, 'prefill_tps')}.", "",
           relay_line(lay), "",
           f"Greedy outputs identical, Hydra peer vs stock peer: relay {lay['identical_runs']}, direct line "
           f"{lay['direct_identical_runs']} of {lay['runs']} runs. "
           f"SOLO (a different split of the same arithmetic) agrees with them on at least the first "
           f"{lay['solo_agree_min']} of {st['tokens']} tokens.", "",
           "Bytes on the wire, the same model loaded twice onto the same peer (the peer's relay counters "
           "before/after each load):", "", loads_table(rep["loads"]), ""]
    moe = rep.get("moe")
    if moe:
        ms = moe["summary"]
        out += [f"Expert split: a tiny MoE from `scripts/make_tiny_moe.py` ({moe['size_bytes'] / 1e6:.1f} MB, "
                f"4 layers × 4 experts, 2 used), `override_tensors: {json.dumps(EXPERTS)}`, "
                f"`tensor_split: [1.0, 0.0]` (layers on the head, experts on the peer); the same alternation "
                f"and request shape, {st['moe_repeat']} measured requests per load (their median is the run's):", "",
                results_table(ms, [("prefill_tps", f"prefill tok/s ({st['prompt_tokens']}-token prompt)"),
                                   ("decode_tps", f"decode tok/s ({st['tokens']} tokens)")]), "",
                f"Per run, decode tok/s: {runs_line(ms, 'decode_tps')}.", "",
                relay_line(ms), "",
                f"Greedy outputs identical, Hydra peer vs stock peer: relay {ms['identical_runs']}, direct line "
                f"{ms['direct_identical_runs']} of {ms['runs']} runs.", ""]
    if rep.get("relay_by_command"):
        by = rep["relay_by_command"]
        out += ["ggml-RPC commands the peer's relay received over the whole run: "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])) + "; graphs that "
                f"repeated the one the server held, sent on as GRAPH_RECOMPUTE: {rep.get('relay_graphs_recomputed', 0):,}.",
                ""]
    out += [f"Other processes' share of the CPUs during a measured request: at most "
            f"{max(lay['max_foreign_cpu'], (moe or {}).get('summary', {}).get('max_foreign_cpu', 0)):.0%}.", ""]
    return "\n".join(out) + "\n"


# ----- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="alternating runs (default: 5)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per measured request (default: 64)")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length in tokens (default: 256)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads of the head, the peer and the stock "
                    "server (default: 1)")
    ap.add_argument("--moe", action=argparse.BooleanOptionalAction, default=True,
                    help="also the tiny MoE's expert split (default: on)")
    ap.add_argument("--moe-repeat", type=int, default=5, metavar="K",
                    help="measured requests per load in the expert split, their median per run (default: 5)")
    ap.add_argument("--seed", type=int, default=1234, help="prompt seed")
    ap.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.tokens < 2 or args.threads < 1:
        ap.error("--runs ≥ 1, --tokens ≥ 2, --threads ≥ 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the processes
    os.environ.update(SINGLE_THREAD_ENV)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"bench: {time.monotonic() - t_start:6.1f}s {msg}", file=sys.stderr, flush=True)

    command = ".venv/bin/python scripts/bench_combine.py " + " ".join(
        shlex.quote(display_path(a)) for a in (sys.argv[1:] if argv is None else argv))
    gguf = models_dir() / SMOLLM
    if not gguf.exists():
        raise SystemExit(f"bench: {gguf} is missing (scripts/setup fetches the default models)")
    tok = Tokenizer(gguf)
    maker = PromptMaker(tok, args.seed)
    prompts = [maker.make(args.prompt_tokens) for _ in range(args.runs * 2)]
    T = args.threads
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": command, "machine": machine(),
        "commit": git_describe(),
        "settings": {"model": MODEL, "gguf": gguf.name, "tensor_split": SPLIT, "threads": T, "runs": args.runs,
                     "tokens": args.tokens, "prompt_tokens": args.prompt_tokens,
                     "moe_repeat": args.moe_repeat if args.moe else None,
                     "n_ctx": 1024 if args.prompt_tokens + args.tokens < 900 else 4096},
    }
    with tempfile.TemporaryDirectory(prefix="bench-combine-") as tmpdir:
        tmp = Path(tmpdir)
        head_defaults = {"n_threads": T, "n_threads_batch": T, "n_ctx": report["settings"]["n_ctx"],
                         "n_parallel": 1, "temperature": 0, "cache_prompt": False}
        peer = Engine(tmp, name="peer", defaults={"n_threads": T, "n_parallel": 1, "n_ctx": 512},
                      extra={"rpc": {"ggml_threads": T, "cache_dir": str(tmp / "tensor-cache")}},
                      env=SINGLE_THREAD_ENV)
        direct_peer = Engine(tmp, name="peer-direct", defaults={"n_threads": T, "n_parallel": 1, "n_ctx": 512},
                             extra={"rpc": {"ggml_threads": T, "cache_dir": str(tmp / "tensor-cache-direct"),
                                            "ggml_direct_from": ["127.0.0.0/8"]}},
                             env=SINGLE_THREAD_ENV)
        head = Engine(tmp, name="head", defaults=head_defaults, env=SINGLE_THREAD_ENV)
        stock_proc = None
        try:
            for e in (peer, direct_peer, head):
                e.http.timeout = httpx.Timeout(600, connect=10)
            stock_proc, stock = start_stock(T)
            eventually(lambda: relay_stats(peer), 60, "the peer's ggml-RPC relay", until=lambda s: s["ready"],
                       ignore=(OSError,), context=peer.log)
            eventually(lambda: relay_stats(direct_peer), 60, "the direct peer's line", until=lambda s: s["direct"]["ready"],
                       ignore=(OSError,), context=direct_peer.log)
            head.notify.wait_for("READY=1", 60)
            hydra = f"127.0.0.1:{rpc_port(peer)}"
            direct = f"127.0.0.1:{rpc_port(direct_peer)}"
            guard = CpuGuard(lambda: [p.pid for p in (head.proc, peer.proc, direct_peer.proc, stock_proc)
                                      if p is not None])
            log(f"peer {hydra}, stock {stock}, head {head.url}; {T} thread(s) each")

            # 2. bytes on the wire: the first and a second load onto the same peer
            combine = {"model": MODEL, "rpc_servers": [hydra], "tensor_split": SPLIT, "override_tensors": None}
            s0 = relay_stats(peer)
            first = configure(head, **combine)
            s1 = relay_stats(peer)
            with RpcClient(("127.0.0.1", rpc_port(head))) as c:
                placement = c.info()["combine"]["placement"]
            configure(head, model=None)
            second = configure(head, **combine)
            s2 = relay_stats(peer)
            keys = ("weight_bytes", "cache_hits", "cache_hit_bytes", "cache_misses")
            report["loads"] = {"first": {"load_s": load_seconds(first), **{k: s1[k] - s0[k] for k in keys}},
                               "second": {"load_s": load_seconds(second), **{k: s2[k] - s1[k] for k in keys}},
                               "relay_after": {k: s2[k] for k in keys}}
            from hydrad.engine import gguf_meta
            report["placement"] = {**placement, "n_layer": gguf_meta.block_count(gguf)}
            log(f"loads onto the peer: first {report['loads']['first']}, second {report['loads']['second']}")

            # 1. layer split: Hydra peer, stock peer, SOLO, alternating
            configs = {"hydra": combine, "direct": {**combine, "rpc_servers": [direct]},
                       "stock": {**combine, "rpc_servers": [stock]},
                       "solo": {**combine, "rpc_servers": None, "tensor_split": None}}
            commands = lambda: int(relay_stats(peer)["commands"])  # noqa: E731
            report["layer"] = alternate(head, configs, lambda i: prompts[i], args, guard, "layer split", log,
                                        commands=commands)

            # 3. expert split of a tiny MoE
            if args.moe:
                moe = tmp / "tiny-moe.gguf"
                subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_moe.py"), str(moe)], check=True,
                               cwd=str(REPO), capture_output=True, timeout=300)
                mconf = {"model": str(moe), "rpc_servers": [hydra], "tensor_split": [1.0, 0.0],
                         "override_tensors": EXPERTS}
                mconfigs = {"hydra": mconf, "direct": {**mconf, "rpc_servers": [direct]},
                            "stock": {**mconf, "rpc_servers": [stock]},
                            "solo": {**mconf, "rpc_servers": None, "tensor_split": None, "override_tensors": None}}
                report["moe"] = {"size_bytes": moe.stat().st_size,
                                 **alternate(head, mconfigs, lambda i: prompts[args.runs + i], args, guard,
                                             "expert split", log, repeat=args.moe_repeat,
                                             commands=commands)}
            final = relay_stats(peer)
            report["relay_by_command"] = final.get("by_command")  # the whole run, per command
            report["relay_graphs_recomputed"] = final.get("graphs_recomputed")
            log(f"peer relay, commands over the whole run: {report['relay_by_command']}; graphs sent to the server "
                f"as GRAPH_RECOMPUTE because they repeated the one it held: {report['relay_graphs_recomputed']}")
        finally:
            head.stop()
            peer.stop()
            direct_peer.stop()
            if stock_proc is not None:
                terminate(stock_proc, 10)
            tok.close()
    report["elapsed_s"] = round(time.monotonic() - t_start, 1)
    for part in ("layer", "moe"):
        if part in report:
            for r in report[part]["runs"]:
                for s in SIDES:
                    r[s]["text"] = "".join(r[s].pop("pieces"))
    lay = report["layer"]["summary"]
    print(f"\nlayer split, medians: decode tok/s hydra {_f(lay['decode_tps']['hydra'])}, stock "
          f"{_f(lay['decode_tps']['stock'])}, solo {_f(lay['decode_tps']['solo'])}; hydra/stock "
          f"{_r(lay['decode_tps']['hydra_over_stock'])}; prefill tok/s hydra {_f(lay['prefill_tps']['hydra'])}, "
          f"stock {_f(lay['prefill_tps']['stock'])}, solo {_f(lay['prefill_tps']['solo'])}; hydra/stock "
          f"{_r(lay['prefill_tps']['hydra_over_stock'])}; identical {lay['identical_runs']}/{lay['runs']}; direct line "
          f"÷ stock: decode {_r(lay['decode_tps']['direct_over_stock'])}, prefill "
          f"{_r(lay['prefill_tps']['direct_over_stock'])}, identical {lay['direct_identical_runs']}/{lay['runs']}",
          flush=True)
    if "moe" in report:
        ms = report["moe"]["summary"]
        print(f"expert split, medians: decode tok/s hydra {_f(ms['decode_tps']['hydra'])}, stock "
              f"{_f(ms['decode_tps']['stock'])}, solo {_f(ms['decode_tps']['solo'])}; hydra/stock "
              f"{_r(ms['decode_tps']['hydra_over_stock'])}; identical {ms['identical_runs']}/{ms['runs']}; direct line "
              f"÷ stock: decode {_r(ms['decode_tps']['direct_over_stock'])}, identical "
              f"{ms['direct_identical_runs']}/{ms['runs']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json}")
    if args.markdown:
        print("\n" + markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

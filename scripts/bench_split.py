#!/usr/bin/env python3
"""The prefill/decode split measured against the best single engine, on a pool where one engine is slower.

A real coordinator and two real hydrad engines on loopback:

* **fast**: ``--fast-threads`` CPU threads (default 2), serving a Q8_0 sibling of SmolLM2-135M that
  this script makes with llama.cpp's own quantizer (as ``llama-quantize`` would);
* **slow**: ``--slow-threads`` threads (default 1), serving SmolLM2-135M Q4_1 as shipped: the model the
  requests ask for, so routing's only single-engine choice is the slow engine.

Both engines first answer one long prompt each so that their heartbeats carry measured speeds (the
split never plans on unmeasured ones). Then, for each prompt length (``--sizes``, tokens) and
``--runs`` rounds, alternating the order within a round, with a fresh prompt every time:

* **split**: the request goes to the coordinator (streaming); routing plans and, where the plan says
  it pays, the fast engine prefills, the KV moves to the slow engine, which decodes. The answer's
  ``X-Hydra-Route`` header says whether it was split.
* **slow alone**: the same kind of request sent straight to the slow engine (streaming), i.e. what the
  pool does with the split off, without the coordinator's hop (about a millisecond, see
  ``bench_coordinator.py``).

Reported per size: median TTFT and total time of each, the ratios split ÷ slow alone (goal for the
total: ≤ 0.8 where the plan says it pays), how many requests were split, and the plan's own estimate.
The fast engine serving the prompt itself (Q8_0, direct) is shown for context: it is what a pool
could do if the request accepted the other quant.

    .venv/bin/python scripts/bench_split.py --markdown

``--markdown`` prints a section for docs/benchmarks.md (it does not write the file).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as dt
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_engine import describe_machine, git_describe, machine  # noqa: E402
from tests.support.coordinator import Coordinator  # noqa: E402
from tests.support.engine import REGISTRY, SMOLLM, Engine, models_dir, sibling_quant  # noqa: E402

Q4, Q8 = "smollm2-135m", "smollm2-135m-q8"
WORDS = ("amber anchor apple arrow autumn badger bamboo basket beacon birch blanket breeze bridge cactus candle "
         "canyon carpet castle cedar cherry cinder cliff clover cobalt comet copper coral cotton crater cricket").split()


def log(msg: str) -> None:
    print(f"[bench_split {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompt(tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens of SmolLM2's vocabulary (about 5 tokens per line below), starting with a
    number no other prompt has, so nothing is reused from an earlier request."""
    lines = [f"Record {rng.randrange(10**9)}."]
    lines += [f"{rng.choice(WORDS)} {i} {rng.choice(WORDS)}." for i in range(max(1, tokens // 5))]
    return " ".join(lines) + " Summarize the records."


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streaming completion: TTFT (first content chunk), total, the headers and the usage."""
    t0 = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with client.stream("POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.read()[:300]!r}")
        headers = dict(r.headers)
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ttft is None and any(c.get("text") for c in ev.get("choices") or []):
                ttft = time.perf_counter() - t0
            usage = ev.get("usage") or usage
    total = time.perf_counter() - t0
    return {"ttft_s": ttft if ttft is not None else total, "total_s": total, "route": headers.get("x-hydra-route"),
            "prefill_engine": headers.get("x-hydra-prefill-engine"), "engine": headers.get("x-hydra-engine"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    q8 = sibling_quant(models_dir() / SMOLLM, tmp / "SmolLM2-135M-Instruct.Q8_0.gguf")
    reg = yaml.safe_load(REGISTRY.read_text())
    reg["models"][Q8] = {**reg["models"][Q4], "path": str(q8), "quant": "Q8_0", "size_bytes": q8.stat().st_size}
    reg_path = tmp / "models.yaml"
    reg_path.write_text(yaml.safe_dump(reg))
    n_ctx = 4 * (int(max(args.sizes) * 1.5) + args.max_tokens + 256)  # two slots' worth of prompts, with room
    c = Coordinator(tmp, extra={"registry": str(reg_path), "first_token_timeout_s": 600}, heartbeat_interval_s=0.5)
    engines: list[Engine] = []
    try:
        c.wait_ready()
        common = {"temperature": 0, "n_ctx": n_ctx, "n_parallel": 2}
        fast = Engine(tmp, name="fast", defaults={"model": Q8, "n_threads": args.fast_threads,
                                                  "n_gpu_layers": args.fast_gpu_layers, **common},
                      extra={"registry": str(reg_path), "bus": c.engine_bus(heartbeat_interval_s=0.5)})
        engines.append(fast)
        slow = Engine(tmp, name="slow", defaults={"model": Q4, "n_threads": args.slow_threads,
                                                  "n_gpu_layers": args.slow_gpu_layers, **common},
                      extra={"registry": str(reg_path), "bus": c.engine_bus(heartbeat_interval_s=0.5)})
        engines.append(slow)
        for e in engines:
            e.wait_ready(300)
            e.http.timeout = httpx.Timeout(600)
        c.http.timeout = httpx.Timeout(600)
        c.wait_serving({"fast": Q8, "slow": Q4})
        rng = random.Random(args.seed)
        log("warming up: each engine measures its speeds")
        for model in (Q8, Q4):
            stream(c.http, "/v1/completions", {"model": model, "prompt": prompt(min(args.sizes), rng), "max_tokens": 8,
                                               "temperature": 0})
        c.wait_engines(lambda es: all(es[n]["prefill_tps"] > 0 and es[n]["decode_tps"] > 0 for n in ("fast", "slow")),
                       30, what="measured speeds")
        rows: list[dict[str, Any]] = []
        for size in args.sizes:
            samples: dict[str, list[dict[str, Any]]] = {"split": [], "slow": [], "fast": []}
            plans: list[dict[str, Any] | None] = []
            for i in range(args.runs):
                order = ["split", "slow", "fast"] if i % 2 == 0 else ["slow", "split", "fast"]
                for kind in order:
                    body = {"prompt": prompt(size, rng), "max_tokens": args.max_tokens, "temperature": 0,
                            "ignore_eos": True}
                    if kind == "split":
                        plans.append(c.http.post("/admin/route", json={"model": Q4, **body}).json()["split"]["plan"])
                        res = stream(c.http, "/v1/completions", {"model": Q4, **body})
                    else:
                        res = stream((slow if kind == "slow" else fast).http, "/v1/completions", body)
                    samples[kind].append(res)
                    log(f"{size} tokens, run {i + 1}/{args.runs}, {kind}: ttft {res['ttft_s']:.3f} s, total "
                        f"{res['total_s']:.3f} s, route {res['route']}, cached {res['cached_tokens']}")
            med = {k: {m: median([s[m] for s in v]) for m in ("ttft_s", "total_s")} for k, v in samples.items()}
            made = [p for p in plans if p]
            rows.append({"size": size, "prompt_tokens": median([s["prompt_tokens"] or 0 for s in samples["slow"]]),
                         "samples": samples, "median": med,
                         "split_count": sum(1 for s in samples["split"] if s["route"] == "split"),
                         "plan_total_s": median([p["total_s"] for p in made]),
                         "plan_single_s": median([p["single_s"] for p in made]),
                         "ttft_ratio": med["split"]["ttft_s"] / med["slow"]["ttft_s"],
                         "total_ratio": med["split"]["total_s"] / med["slow"]["total_s"]})
        es = c.engines()
        speeds = {n: {"prefill_tps": es[n]["prefill_tps"], "decode_tps": es[n]["decode_tps"]} for n in ("fast", "slow")}
        transfers = c.http.post("/admin/route", json={"model": Q4, "prompt": "x"}).json()["split"]["transfers"]
        abandoned = [line for line in c.log().splitlines() if "split abandoned" in line]
        return {"rows": rows, "speeds": speeds, "transfers": transfers, "abandoned": abandoned}
    finally:
        for e in engines:
            e.stop()
        c.stop()


def markdown(rep: dict[str, Any]) -> str:
    s = rep["settings"]
    gpu_host = rep.get("where") == "GPU host"

    def where(n: str) -> str:
        layers = s.get(f"{n}_gpu_layers", -1)
        if not gpu_host:
            return ""
        return ", all layers on the GPU" if layers == -1 else ", on the CPU" if layers == 0 else f", {layers} layers on the GPU"
    lines = [f"## {rep['date']}: the prefill/decode split against the slow engine alone ({rep['where']})", "",
             f"Command: `{rep['command']}` ({rep['elapsed_s']:.0f} s)", "",
             f"Machine: {describe_machine(rep['machine'])}. hydrad: commit {rep['commit']}. Pool: coordinator + "
             f"engine *fast* ({s['fast_threads']} threads{where('fast')}, SmolLM2-135M requantized to Q8_0 with llama.cpp's "
             f"quantizer) + engine *slow* ({s['slow_threads']} thread(s){where('slow')}, SmolLM2-135M Q4_1, the model asked for). "
             f"Streaming completions of {s['max_tokens']} tokens (`ignore_eos`), greedy; {s['runs']} rounds per "
             f"size, order alternating, a fresh prompt every request. Speeds the engines measured: fast "
             f"{rep['speeds']['fast']['prefill_tps']:.0f} prompt tok/s, {rep['speeds']['fast']['decode_tps']:.0f} "
             f"generated tok/s; slow {rep['speeds']['slow']['prefill_tps']:.0f} / "
             f"{rep['speeds']['slow']['decode_tps']:.0f}. Transfers measured by the coordinator: "
             f"{rep['transfers'].get('transfers')}, {float(rep['transfers'].get('bytes_per_s') or 0) / 1e6:.0f} MB/s "
             f"+ {float(rep['transfers'].get('fixed_s') or 0) * 1000:.1f} ms each.", "",
             "| prompt tokens | split: TTFT / total (s) | slow alone: TTFT / total (s) | **split ÷ slow: TTFT / total** "
             "(goal total ≤ 0.8) | split / requests | plan: split / single (s) | fast alone, Q8_0: TTFT / total (s) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        m = r["median"]
        lines.append(f"| {r['prompt_tokens']:.0f} | {m['split']['ttft_s']:.3f} / {m['split']['total_s']:.3f} | "
                     f"{m['slow']['ttft_s']:.3f} / {m['slow']['total_s']:.3f} | **{r['ttft_ratio']:.2f} / "
                     f"{r['total_ratio']:.2f}** | {r['split_count']}/{len(r['samples']['split'])} | "
                     f"{r['plan_total_s']:.2f} / {r['plan_single_s']:.2f} | "
                     f"{m['fast']['ttft_s']:.3f} / {m['fast']['total_s']:.3f} |")
    lines += ["", "Medians. TTFT is the first content chunk at the client; *total* the whole stream. The split's "
              "TTFT includes the fast engine's prefill, the KV transfer between the merged ports and the slow "
              "engine's one prompt token; the CPU threads of the two engines share the machine's cores, so the "
              "fast engine's prefill runs while the slow one is idle.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1024,2048", help="prompt lengths in tokens (default 512,1024,2048)")
    ap.add_argument("--runs", type=int, default=3, help="rounds per size (default 3)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    ap.add_argument("--fast-threads", type=int, default=2, help="the fast engine's n_threads (default 2)")
    ap.add_argument("--slow-threads", type=int, default=1, help="the slow engine's n_threads (default 1)")
    ap.add_argument("--fast-gpu-layers", type=int, default=-1,
                    help="the fast engine's n_gpu_layers (default -1: all, on a GPU build; CPU builds ignore it)")
    ap.add_argument("--slow-gpu-layers", type=int, default=-1,
                    help="the slow engine's n_gpu_layers; 0 on a GPU host makes it a CPU engine beside a GPU one")
    ap.add_argument("--seed", type=int, default=1, help="prompt seed (default 1)")
    ap.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hydra-bench-split-") as tmp:
        result = run(args, Path(tmp))
    rep = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
           "commit": git_describe(), "elapsed_s": time.monotonic() - t0,
           "where": "GPU host" if (machine().get("gpus") or []) else "CPU",
           "command": ".venv/bin/python scripts/bench_split.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
           "settings": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")}, **result}
    for r in rep["rows"]:
        log(f"{r['prompt_tokens']:.0f} tokens: split/slow TTFT {r['ttft_ratio']:.2f}, total {r['total_ratio']:.2f}, "
            f"split {r['split_count']}/{len(r['samples']['split'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=str))
    if args.markdown:
        print(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Where a decode step's time goes on a GPU: the kernels of one step, under Nsight Compute, for hydrad
and llama-server side by side.

Each server runs twice on the same model and flags (scripts/bench_engine.py's ServerSettings, so both
do the same work):

1. unprofiled: one greedy stream of ``--n-prompt`` → ``--n-gen`` tokens, ``--runs`` times; the step
   time is 1000 ÷ the median decode rate (and hydrad's own step counters split it into submit,
   overlap, device wait, sample and the rest);
2. under ``ncu`` (``--graph-profiling node``, only ``gpu__time_duration``, the clocks and, by default, the
   caches left alone): the same request once, with ``--count`` kernels profiled after the first
   ``--skip`` (past the load, the warm-up and the prompt, deep in the decode). The decode step's kernel
   sequence repeats, so its period is found from the kernel names and the kernels of one period are
   one step.

What a step costs is then split: the kernels' own time (summed, as the profiler serialises them) and
the rest (the host's work between steps, launch gaps, synchronisation). The profiler runs each kernel
alone, which costs a small kernel a few microseconds more than inside a graph, so on a device-bound
step the kernels' sum comes out above the unprofiled step and "the rest" is negative: read that as
"no host time shows". The kernels' time is set beside the physical limit (the weights' bytes read once
per token ÷ ``--bandwidth``). Profiling slows the request many times over; only the kernels' durations
are used from that run.

    scripts/bench_step_profile.py --llama-server "$(scripts/build_llama_server -q --cuda 90)" \\
        --model models/rand-3b.Q4_K_M.gguf --json profile.json --markdown
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import collections
import csv
import datetime as dt
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench_engine as be  # noqa: E402



def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out + [g for c in out for g in _children(c)]


def stop_profiled(srv: be.Server, timeout: float = 300) -> None:
    """Stop the server that runs under ncu (SIGTERM to ncu's children), then wait for ncu to write its
    report."""
    assert srv.proc is not None
    for pid in _children(srv.proc.pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait(10)


def read_kernels(ncu: str, report: Path) -> list[tuple[str, float]]:
    """(kernel name, µs) of every profiled kernel, in launch order, from an ncu report."""
    out = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base",
                          "--metrics", "gpu__time_duration.sum"], capture_output=True, text=True, check=True).stdout
    rows = list(csv.reader(io.StringIO(out)))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    cols = rows[head]
    name_i, t_i = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    kernels = []
    for r in rows[head + 1:]:
        if len(r) <= max(name_i, t_i):
            continue
        try:
            kernels.append((r[name_i], float(r[t_i].replace(",", "")) / 1000))  # ns → µs
        except ValueError:
            continue  # the units row
    return kernels


def period(names: list[str], lo: int = 8, hi: int = 4000) -> int | None:
    """The length P for which the name sequence repeats best (names[i] == names[i+P] at the most
    positions), the shortest such P where several tie within 0.2 %: the kernels of one decode step. A
    layer's kernels repeat too, but every step boundary breaks that shorter period."""
    n = len(names)
    scores = {p: sum(1 for i in range(n - p) if names[i] == names[i + p]) / (n - p)
              for p in range(lo, min(hi, n // 2) + 1)}
    if not scores or max(scores.values()) < 0.95:
        return None
    best = max(scores.values())
    return min(p for p, f in scores.items() if f >= best - 0.002)


def short(name: str) -> str:
    base = name.split("(", 1)[0]
    return base.split("<", 1)[0].replace("void ", "").strip()[:60]


def analyse(kernels: list[tuple[str, float]]) -> dict[str, Any]:
    names = [k for k, _ in kernels]
    p = period(names)
    if p is None:
        return {"kernels": len(kernels), "period": None}
    steps = len(kernels) // p
    per_step = [sum(t for _, t in kernels[i * p:(i + 1) * p]) for i in range(steps)]
    by = collections.defaultdict(lambda: [0.0, 0])
    for name, t in kernels[:steps * p]:
        by[short(name)][0] += t / steps
        by[short(name)][1] += 1
    top = sorted(([n, round(v[0], 1), v[1] // steps] for n, v in by.items()), key=lambda r: -r[1])
    return {"kernels": len(kernels), "period": p, "steps": steps, "kernel_us_per_step": statistics.median(per_step),
            "kernel_us_per_step_all": [round(x, 1) for x in per_step], "top": top[:12],
            "one_step": [[short(n), round(t, 2)] for n, t in kernels[:p]]}


def up(srv: be.Server, args: argparse.Namespace) -> None:
    """Start a server; hydrad boots without a model and is configured with it."""
    srv.start()
    if isinstance(srv, be.Hydrad):
        srv.load(args.alias)


def timed(srv: be.Server, maker: be.PromptMaker, args: argparse.Namespace) -> dict[str, Any]:
    w = be.Workload("a", args.n_prompt, args.n_gen, 1)
    be.run_workload(srv.url, be.Workload("warm", 64, 16, 1), [maker.make(64)], args.seed)
    before = be.step_counters(srv.url)
    rates = [be.run_workload(srv.url, w, [maker.make(args.n_prompt)], args.seed)["decode_tps"] for _ in range(args.runs)]
    prof = be.step_profile(before, be.step_counters(srv.url))
    tps = statistics.median(r for r in rates if r)
    return {"decode_tps": tps, "decode_tps_all": rates, "step_us": 1e6 / tps, "hydrad_step_parts_ms": prof}


def side(name: str, make: Any, maker: be.PromptMaker, args: argparse.Namespace,
         work: Path, log: Any) -> dict[str, Any]:
    d = work / name
    d.mkdir()
    srv = make(d)
    log(f"{name}: timing {args.runs} runs, unprofiled")
    try:
        up(srv, args)
        out = timed(srv, maker, args)
    finally:
        srv.stop()
    log(f"{name}: {out['decode_tps']:.1f} tok/s, {out['step_us']:.0f} µs a step; now under ncu")
    d2 = work / f"{name}-ncu"
    d2.mkdir()
    srv = make(d2)
    report = d2 / "report"
    srv.wrap = [args.ncu, "--target-processes", "all", "--clock-control", "none", "--cache-control", args.cache_control,
                "--graph-profiling", "node",
               "--metrics", "gpu__time_duration.sum", "--launch-skip", str(args.skip), "--launch-count",
                str(args.count), "-f", "-o", str(report)]
    try:
        up(srv, args)
        t0 = time.monotonic()
        be.run_workload(srv.url, be.Workload("p", args.n_prompt, args.n_gen, 1), [maker.make(args.n_prompt)], args.seed)
        log(f"{name}: profiled request took {time.monotonic() - t0:.0f} s")
        stop_profiled(srv)
        kernels = read_kernels(args.ncu, report.with_suffix(".ncu-rep"))
    except (RuntimeError, OSError, StopIteration, ValueError, subprocess.CalledProcessError, be.httpx.HTTPError) as e:
        stop_profiled(srv)
        log(f"{name}: the profiled run failed ({type(e).__name__}: {e}); its log ends:\n{srv.log_tail()}")
        out["profile"] = {"kernels": 0, "period": None, "error": f"{type(e).__name__}: {e}"}
        return out
    out["profile"] = analyse(kernels)
    a = out["profile"]
    if a.get("period"):
        out["kernel_share"] = a["kernel_us_per_step"] / out["step_us"]
        log(f"{name}: {a['kernels']} kernels, {a['period']} a step, {a['kernel_us_per_step']:.0f} µs of kernels "
            f"a step ({out['kernel_share']:.0%} of the step)")
    else:
        log(f"{name}: {a['kernels']} kernels profiled, no repeating step found (raise --count or --skip)")
    return out


def markdown(res: dict[str, Any]) -> str:
    lim = res["physical_limit_us"]
    lines = [f"Command: `{res['command']}`  ", f"Model: {res['model']} ({res['size_bytes'] / 1e9:.2f} GB); "
             f"physical limit {lim:.0f} µs a token at {res['bandwidth_tbs']} TB/s.", "",
             "| server | step (unprofiled) | kernels a step | kernels' time a step | ÷ step | rest of the step | kernels ÷ limit |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in ("hydrad", "llama-server"):
        s = res.get(name)
        if not s:
            continue
        a = s["profile"]
        if not a.get("period"):
            lines.append(f"| {name} | {s['step_us']:.0f} µs | (no period in {a['kernels']} kernels) | | | | |")
            continue
        k = a["kernel_us_per_step"]
        lines.append(f"| {name} | {s['step_us']:.0f} µs | {a['period']} | {k:.0f} µs | {k / s['step_us']:.2f} | "
                     f"{s['step_us'] - k:.0f} µs | {k / lim:.1f}× |")
    for name in ("hydrad", "llama-server"):
        s = res.get(name)
        if not s or not s["profile"].get("period"):
            continue
        lines += ["", f"{name}, the kernels of one step by time (µs a step, launches a step):", "",
                  "| kernel | µs | launches |", "|---|---:|---:|"]
        lines += [f"| `{n}` | {t} | {c} |" for n, t, c in s["profile"]["top"]]
        parts = s.get("hydrad_step_parts_ms")
        if parts:
            lines += ["", "hydrad's own step counters (ms a step): " + ", ".join(
                f"{p} {parts[p]:.3f}" for p in be.STEP_PARTS) + f"; total {parts['step_ms']:.3f}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="registry alias or GGUF path")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (the reference side); none: hydrad only")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu", help="Nsight Compute's command line")
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=384, help="long enough that --skip lands inside the decode")
    ap.add_argument("--runs", type=int, default=3, help="unprofiled runs that time a step")
    ap.add_argument("--skip", type=int, default=30000, help="kernels let through unprofiled first")
    ap.add_argument("--count", type=int, default=2000, help="kernels profiled (a few steps' worth)")
    ap.add_argument("--cache-control", choices=("none", "all"), default="none",
                    help="ncu's cache flush before each kernel; none keeps the L2 warm as in an unprofiled step")
    ap.add_argument("--bandwidth", type=float, default=4.8, help="memory bandwidth, TB/s (H200: 4.8)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--env-lib", default=None, help="LLAMA_CPP_LIB_PATH for hydrad")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md (it does not write the file)")
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(f"profile: {msg}", file=sys.stderr, flush=True)

    args.alias, gguf = be.resolve_model(args.model)
    settings = be.ServerSettings(n_ctx=args.n_ctx, n_batch=512, n_ubatch=512, n_parallel=1, kv_unified=True,
                                 threads=4, flash_attn="auto", gpu_layers=-1)
    tok = be.Tokenizer(gguf)
    maker = be.PromptMaker(tok, args.seed)
    res: dict[str, Any] = {"command": " ".join(["scripts/bench_step_profile.py", *sys.argv[1:]]),
                           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "model": gguf.name, "size_bytes": gguf.stat().st_size, "bandwidth_tbs": args.bandwidth,
                           "physical_limit_us": gguf.stat().st_size / (args.bandwidth * 1e12) * 1e6}
    with tempfile.TemporaryDirectory(prefix="hydra-profile-") as tmp:
        work = Path(tmp)
        res["hydrad"] = side("hydrad", lambda d: be.Hydrad(d, settings, args.env_lib), maker, args, work, log)
        if args.llama_server:
            res["llama-server"] = side("llama-server", lambda d: be.LlamaServer(d, args.llama_server, settings, gguf, []),
                                       maker, args, work, log)
    tok.close()
    md = markdown(res)
    if args.markdown:
        md = f"### A decode step under Nsight Compute ({res['date']})\n\n{md}"
    print(md)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

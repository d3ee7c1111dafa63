#!/usr/bin/env python3
"""Expert-mode switches (SOLO ↔ COMBINE of an MoE model) without a reload: p50/p99 over N switches.

A peer hydrad lends its CPU over its merged port; a head hydrad loads the tiny MoE of
scripts/make_tiny_moe.py SOLO. The first ``POST /control/set_expert_mode {"mode": "combine"}`` is a
model load that keeps the SOLO generation resident; then ``--switches`` switches alternate
solo/combine, each followed by one short greedy request whose answer must equal that mode's
answer before the round trip. Reported: the engine's own switch time (the ``seconds`` of the
answer: the exchange on the engine thread) and the client's wall time of the HTTP call, p50/p99,
against the goal p99 < 100 ms; and the time of that first switch (a load) for comparison.

    .venv/bin/python scripts/bench_expert_mode.py --switches 100 --markdown
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support.engine import Engine  # noqa: E402


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def greedy(engine: Engine) -> str:
    r = engine.http.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 8,
                                                  "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switches", type=int, default=100, help="switches measured (default 100)")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-expert-mode-"))
    moe = tmp / "tiny-moe.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_moe.py"), str(moe)], check=True,
                   capture_output=True, cwd=str(REPO))
    peer = Engine(tmp, name="peer", defaults={"n_threads": 1}, extra={"rpc": {"ggml_threads": 1}})
    head = Engine(tmp, name="head", defaults={"n_threads": 1, "n_ctx": 512, "n_parallel": 1})
    try:
        port = int(yaml.safe_load(peer.config.read_text())["rpc"]["port"])
        head.notify.wait_for("READY=1", 60)
        peer.notify.wait_for("READY=1", 60)
        r = head.configure(model=str(moe))
        assert r.status_code == 200, r.text
        answers = {"solo": greedy(head)}
        t0 = time.perf_counter()
        r = head.http.post("/control/set_expert_mode?wait=1", json={"mode": "combine", "peer": f"127.0.0.1:{port}"})
        first = time.perf_counter() - t0
        assert r.status_code == 200 and r.json()["resident"] is False, r.text
        answers["combine"] = greedy(head)
        engine_s: list[float] = []
        wall_s: list[float] = []
        mismatches = 0
        for i in range(args.switches):
            mode = "solo" if i % 2 == 0 else "combine"
            t0 = time.perf_counter()
            r = head.http.post("/control/set_expert_mode", json={"mode": mode})
            wall_s.append(time.perf_counter() - t0)
            body = r.json()
            assert r.status_code == 200 and body["switched"] and body["resident"], r.text
            engine_s.append(body["seconds"])
            mismatches += greedy(head) != answers[mode]
    finally:
        head.stop()
        peer.stop()
    cmd = "python " + " ".join(shlex.quote(a) for a in [f"scripts/{Path(__file__).name}", *sys.argv[1:]])
    p50e, p99e = pct(engine_s, 0.5) * 1e3, pct(engine_s, 0.99) * 1e3
    p50w, p99w = pct(wall_s, 0.5) * 1e3, pct(wall_s, 0.99) * 1e3
    print(f"engine: p50 {p50e:.2f} ms, p99 {p99e:.2f} ms; HTTP wall: p50 {p50w:.2f} ms, p99 {p99w:.2f} ms; "
          f"first switch (a load) {first * 1e3:.0f} ms; answers changed by a round trip: {mismatches}")
    if args.markdown:
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        from llama_cpp import llama_cpp as C

        where = ("GPU: head and peer share the one GPU, a stand-in for two" if C.llama_supports_gpu_offload()
                 else "CPU")
        print(f"""
## {now}: expert-mode switch without reload (tiny MoE, {where})

Command: `{cmd}`

Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared; absolute times are noisy).
Head and peer are hydrad engines on loopback, one thread each; the model is scripts/make_tiny_moe.py's
default (4 layers, 4 experts, 2 used); COMBINE puts the expert tensors on the peer.

| | p50 | p99 | max | goal |
|---|---:|---:|---:|---|
| switch, engine side (exchange on the engine thread) | {p50e:.2f} ms | {p99e:.2f} ms | {max(engine_s) * 1e3:.2f} ms | p99 < 100 ms |
| switch, HTTP call wall time | {p50w:.2f} ms | {p99w:.2f} ms | {max(wall_s) * 1e3:.2f} ms | |
| first switch to COMBINE (a model load that keeps SOLO resident) | {first * 1e3:.0f} ms | | | |

{args.switches} switches, alternating; after each, an 8-token greedy answer: {mismatches} differed from
that mode's answer before the round trip.
""")
    return 0 if mismatches == 0 and p99e < 100 else 1


if __name__ == "__main__":
    sys.exit(main())

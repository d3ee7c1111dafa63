#!/usr/bin/env python3
"""ggml-RPC through the merged port vs straight to the in-process ggml RPC server it relays to.

A peer process puts every layer of SmolLM2-135M on the engine's device over ggml-RPC and
decodes greedily; we time its decode loop once through the merged port and once against the
internal endpoint, alternating, and report medians and the ratio (goal ≥ 0.95).

    .venv/bin/python scripts/bench_rpc.py --runs 5 --tokens 64
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support.engine import SMOLLM, Engine, models_dir  # noqa: E402

GEN = REPO / "tests" / "support" / "ggml_rpc_generate.py"


def generate(endpoint: str, tokens: int) -> dict:
    r = subprocess.run([sys.executable, str(GEN), endpoint, str(models_dir() / SMOLLM), "The capital of France is",
                        str(tokens)], capture_output=True, text=True, timeout=600, cwd=str(REPO))
    if r.returncode != 0:
        raise SystemExit(f"peer process failed against {endpoint}: {r.stderr[-1000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--markdown", action="store_true", help="accepted for older command lines: the result is printed as markdown either way "
                    "(docs/benchmarks.md is not written)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        e = Engine(Path(tmp), name="rpc-bench")
        try:
            e.notify.wait_for("READY=1", 30)
            time.sleep(0.5)
            merged = f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}"
            m = re.search(r"ggml_rpc=(\S+)", e.log())
            if not m:
                raise SystemExit("the engine runs no ggml RPC server")
            direct = m.group(1)
            generate(merged, 4)  # first contact uploads the weights into the server's tensor cache
            rows: dict[str, list[float]] = {"merged": [], "direct": []}
            same = True
            for i in range(args.runs):
                a = generate(merged, args.tokens)
                b = generate(direct, args.tokens)
                rows["merged"].append(a["decode_tps"])
                rows["direct"].append(b["decode_tps"])
                same &= a["tokens"] == b["tokens"]
                print(f"run {i + 1}: merged {a['decode_tps']:.1f} tok/s, direct {b['decode_tps']:.1f} tok/s", flush=True)
        finally:
            e.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = med["merged"] / med["direct"]
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    text = "\n".join([
        f"## ggml-RPC through the merged port ({time.strftime('%Y-%m-%d')})", "",
        f"Command: `.venv/bin/python scripts/bench_rpc.py {' '.join(sys.argv[1:])}`  ",
        f"Machine: {cpu}, {os.cpu_count()} cores. A peer process loads SmolLM2-135M with every layer on the engine's "
        f"device over ggml-RPC and decodes {args.tokens} tokens greedily; runs alternate between the merged port "
        "and the in-process ggml RPC server's own endpoint.", "",
        "| path | decode tok/s (median) | runs |", "|---|---:|---|",
        f"| merged port (relay) | {med['merged']:.1f} | {', '.join(f'{x:.1f}' for x in rows['merged'])} |",
        f"| direct to the ggml RPC server | {med['direct']:.1f} | {', '.join(f'{x:.1f}' for x in rows['direct'])} |",
        "", f"Ratio merged ÷ direct: **{ratio:.2f}** (goal ≥ 0.95). Greedy tokens identical on every run: {same}.", ""])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

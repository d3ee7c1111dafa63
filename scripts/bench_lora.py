#!/usr/bin/env python3
"""What per-request LoRA scales cost: decode throughput of two requests running at once on one engine
(SmolLM2-135M, two slots), under the same adapter scales, under two different ones, and without any.

llama.cpp applies adapters per context, so a step decodes the slots of one adapter set only
(hydrad/engine/adapters.py): two sets at once take turns step by step, each switch making llama.cpp plan
its graph again. The adapter is a rank-8 LoRA on every layer's attn_q, written here with the ``gguf``
package (tests/support/adapters.py). Each case is run ``--runs`` times, interleaved; the table gives the
median tokens per second over both requests and the switches per generated token.

    .venv/bin/python scripts/bench_lora.py --runs 5 --tokens 96
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydrad.engine import gguf_meta  # noqa: E402
from tests.support.adapters import make_lora  # noqa: E402
from tests.support.engine import SMOLLM, Engine, metric, models_dir  # noqa: E402

CASES = {"same_set": (1.0, 1.0), "two_sets": (0.0, 1.0), "base": (0.0, 0.0)}


def run_once(e: Engine, scales: tuple[float, float], tokens: int) -> tuple[float, float]:
    """Two requests at once, one per scale; (tokens per second over both, switches per token)."""
    done: list[int] = []

    def ask(scale: float) -> None:
        with httpx.Client(base_url=e.url, timeout=600) as http:
            r = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": tokens, "ignore_eos": True,
                                               "cache_prompt": False, "lora": [{"id": 0, "scale": scale}]})
            r.raise_for_status()
            done.append(int(r.json()["tokens_predicted"]))

    switches = metric(e, "hydra_lora_switches_total")
    threads = [threading.Thread(target=ask, args=(s,)) for s in scales]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(done) / wall, (metric(e, "hydra_lora_switches_total") - switches) / max(1, sum(done))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96, help="tokens each request generates")
    ap.add_argument("--threads", type=int, default=0, help="the engine's n_threads (0: every usable CPU)")
    args = ap.parse_args()
    model = models_dir() / SMOLLM
    meta = gguf_meta.metadata(model)
    with tempfile.TemporaryDirectory() as tmp:
        lora = make_lora(Path(tmp) / "lora.gguf", int(meta["llama.embedding_length"]), int(meta["llama.block_count"]),
                         spread=1.0)
        e = Engine(Path(tmp), defaults={"model": "smollm2-135m", "n_ctx": 2048, "n_parallel": 2, "temperature": 0,
                                        "n_threads": args.threads, "lora_adapters": [{"path": str(lora), "scale": 0.0}]})
        try:
            e.wait_ready(300)
            run_once(e, CASES["same_set"], 8)  # the first switch to the adapter, off the clock
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
            for _ in range(args.runs):
                for name, scales in CASES.items():
                    got[name].append(run_once(e, scales, args.tokens))
        finally:
            e.stop()
    table = {name: {"tok_s": round(statistics.median(r[0] for r in rows), 1),
                    "switches_per_token": round(statistics.median(r[1] for r in rows), 3)}
             for name, rows in got.items()}
    print(json.dumps({"runs": args.runs, "tokens": args.tokens, "cases": table}, indent=1))


if __name__ == "__main__":
    main()

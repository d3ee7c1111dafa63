#!/usr/bin/env python3
"""The burst sequence: 32, then 64, then 32 streams arriving together, repeated; counts deaths.

On a GPU, llama.cpp's CUDA-graph path used to abort the server under this load (``CUDA error:
an illegal instruction was encountered`` in ``ggml_backend_cuda_synchronize``): hydrad 4 times
in 4, stock llama-server 3 in 3, both fine with ``GGML_CUDA_DISABLE_GRAPHS=1``. This drives the
sequence against either server, started here on the same model and settings, and reports for
each repeat whether the server lived and how many requests failed. A server that died is
started again (its log's CUDA error lines are kept) so that one run counts every death.

    .venv/bin/python scripts/burst.py --server hydrad --repeats 20
    .venv/bin/python scripts/burst.py --server llama-server --llama-server PATH --repeats 5

Each phase starts all its streams at once (128-token prompt with a fresh random prefix, 128
tokens generated, ``ignore_eos``, sampled with a per-stream seed) and ends when all are done, as
workloads h and i of scripts/bench_engine.py do; the two servers get the settings of
scripts/bench_engine.py with 64 slots. Exit status 0 when no server died and no request failed.
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from bench_engine import (Hydrad, LlamaServer, Server, ServerSettings, describe_machine, machine,  # noqa: E402
                          llama_server_binary, resolve_model)

PHASES = (32, 64, 32)
WORDS = ("graph", "stream", "kernel", "token", "batch", "cache", "queue", "model", "layer", "slot",
         "prompt", "value", "index", "buffer", "thread", "device", "memory", "vector", "matrix", "shape")


@dataclass
class Repeat:
    """One pass of the phases: did the server live, and how did its requests end."""

    ok: int = 0
    failed: int = 0
    died: bool = False
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def prompt(rng: random.Random, n_words: int = 110) -> str:
    """About 128 tokens of SmolLM2's vocabulary, different for every stream (no shared prefix)."""
    return f"Request {rng.getrandbits(48):x}: " + " ".join(rng.choice(WORDS) for _ in range(n_words))


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str | None:
    """None when the stream ended with its [DONE]; else what went wrong."""
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    return None
                if line.startswith("data: ") and '"error"' in line[:40]:
                    return line[6:200]
            return "stream ended without [DONE]"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"


async def phase(url: str, n: int, rng: random.Random, n_gen: int) -> list[str | None]:
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        bodies = [{"prompt": prompt(rng), "max_tokens": n_gen, "stream": True, "ignore_eos": True,
                   "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": rng.getrandbits(31),
                   "cache_prompt": False} for _ in range(n)]
        return list(await asyncio.gather(*(one_stream(client, url, b) for b in bodies)))


def cuda_errors(server: Server) -> list[str]:
    """The log's CUDA error lines and the two after each (the function and the call that saw it)."""
    lines = server.log_tail(400).splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if "CUDA error" in line or "cudaError" in line:
            out.extend(lines[i:i + 3])
    return out[:12]


def run(server: Server, start: Any, repeats: int, pause: float, n_gen: int, seed: int,
        log: Any) -> list[Repeat]:
    rng = random.Random(seed)
    results: list[Repeat] = []
    for k in range(repeats):
        rep = Repeat()
        t0 = time.monotonic()
        for n in PHASES:
            ends = asyncio.run(phase(server.url, n, rng, n_gen))
            rep.ok += sum(e is None for e in ends)
            rep.failed += sum(e is not None for e in ends)
            rep.errors.extend(sorted({e for e in ends if e is not None})[:3])
            if server.proc is not None and server.proc.poll() is not None:
                rep.died = True
                rep.errors.extend(cuda_errors(server))
                break
            time.sleep(pause)
        rep.seconds = time.monotonic() - t0
        results.append(rep)
        log(f"repeat {k + 1}/{repeats}: {'DIED' if rep.died else 'alive'}, {rep.ok} ok, {rep.failed} failed, "
            f"{rep.seconds:.1f} s" + (f"; {rep.errors[:4]}" if rep.errors else ""))
        if rep.died:
            server.stop()
            start()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=("hydrad", "llama-server"), default="hydrad")
    ap.add_argument("--model", default="smollm2-135m", help="registry alias or GGUF path (default: smollm2-135m)")
    ap.add_argument("--repeats", type=int, default=20, help="passes of 32 → 64 → 32 (default: 20)")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between phases (default: 1)")
    ap.add_argument("--n-gen", type=int, default=128, help="tokens each stream generates (default: 128)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary (default: scripts/build_llama_server)")
    ap.add_argument("--env-lib", metavar="PATH", help="run hydrad with LLAMA_CPP_LIB_PATH=PATH")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)

    name, path = resolve_model(args.model)
    settings = ServerSettings(n_ctx=16384 * 2, n_batch=2048, n_ubatch=512, n_parallel=64, kv_unified=True,
                              threads=4, flash_attn="auto", gpu_layers=-1)
    log = lambda msg: print(f"burst: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hydra-burst-") as tmp:
        workdir = Path(tmp)
        server: Server
        if args.server == "hydrad":
            server = Hydrad(workdir, settings, args.env_lib)

            def start() -> None:
                server.start()
                server.load(name)  # type: ignore[attr-defined]
        else:
            server = LlamaServer(workdir, llama_server_binary(args.llama_server), settings, path, [])
            start = server.start
        start()
        try:
            results = run(server, start, args.repeats, args.pause, args.n_gen, args.seed, log)
        finally:
            server.stop()
    deaths = sum(r.died for r in results)
    failed = sum(r.failed for r in results)
    summary = {"server": args.server, "model": name, "repeats": args.repeats, "deaths": deaths,
               "failed_requests": failed, "ok_requests": sum(r.ok for r in results),
               "machine": describe_machine(machine()), "results": [r.__dict__ for r in results]}
    log(f"{args.server}: {deaths} deaths and {failed} failed requests in {args.repeats} repeats")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0 if deaths == 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

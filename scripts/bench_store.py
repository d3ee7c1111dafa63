#!/usr/bin/env python3
"""The Hydra Store measured: deduplication, ingest and restore speed, TTFT from a stored prefix, overhead.

Real engines (hydrad, SmolLM2-135M by default) on loopback, real KV states, a real Store directory
(on tmpfs: ``--dir``, default under /dev/shm). Four parts, one run:

1. **Dedup.** ``--sessions`` sessions share a system prompt of about ``--prefix-tokens`` tokens, each
   with its own question; one engine answers each (one slot, so every session's state is read right
   after its request with STATE_GET), and every state is put in the Store. Bytes stored (distinct
   chunks) ÷ ideal (one prefix plus every session's own suffix, in this model's KV bytes per token);
   goal ≤ 1.1.
2. **Ingest and restore speed** of the same states: ``Store.put`` and ``Store.get`` (every chunk
   hashed and verified) in GB/s, against a plain file copy of the same bytes into the same
   directory (write, fsync, rename; read back); goal ≥ 0.5× of the plain copy.
3. **TTFT from the Store.** Engine A computes a prompt of about ``--prefix-tokens`` tokens and its
   prefix is checkpointed (another conversation with the same prompt); engine B, which shares the Store and has
   never seen the prompt, answers a session with the same prefix: its TTFT (restore + the suffix's
   prefill) ÷ B's TTFT for a cold prompt of the same length (a fresh prefix, nothing stored);
   ``--runs`` pairs, medians; goal ≤ 0.2 at 2K tokens.
4. **Overhead on the request path.** The same engine configuration with and without a Store, a
   request that needs nothing from it (a fresh prompt long enough to be looked up): p50 TTFT
   with minus without (goal ≤ +1 ms), ``--overhead-requests`` alternating requests each.

    .venv/bin/python scripts/bench_store.py --markdown --json store.json

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
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_engine import describe_machine, git_describe, machine  # noqa: E402
from tests.support.engine import Engine  # noqa: E402

from hydrad.store import Store  # noqa: E402
from hydrad.wire.rpcclient import RpcClient  # noqa: E402

MODEL = "smollm2-135m"


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def rpc_addr(e: Engine) -> str:
    return f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}"


def system_prompt(tag: str, tokens: int) -> str:
    """About ``tokens`` tokens of SmolLM2 (≈ 14 tokens per record line), distinct per ``tag``."""
    rng = random.Random(tag)
    lines = [f"Archive {tag}."]
    for i in range(max(1, tokens // 14)):
        lines.append(f"Record {i}: shelf {rng.randint(1, 99)}, box {rng.randint(100, 999)}.")
    return " ".join(lines)


def chat_body(system: str, question: str, max_tokens: int = 1, slot: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if slot is not None:
        body["id_slot"] = slot
    return body


def ttft(e: Engine, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds to the first streamed token, and the final usage."""
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    with e.http.stream("POST", "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content") is not None:
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    return (first if first is not None else time.perf_counter() - t0), usage


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ----- 1 + 2: dedup and speed ---------------------------------------------------------------------

def part_dedup(tmp: Path, store_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One state at a time (64 states of 2K tokens are gigabytes): put into the Store and copied to a
    plain file as it is read, then all read back both ways."""
    e = Engine(tmp, name="dedup", defaults={"model": MODEL, "n_parallel": 1, "n_ctx": args.prefix_tokens + 512,
                                            "temperature": 0})
    store = Store(dir=store_dir, block_tokens=args.block, fsync=True, cap_bytes=64 << 30)
    plain_dir = store_dir.parent / "plain-copy"
    plain_dir.mkdir(parents=True, exist_ok=True)
    system = system_prompt("dedup", args.prefix_tokens)
    put_s: list[float] = []
    plain_w: list[float] = []
    n_tokens: list[int] = []
    first_tokens: list[int] = []
    common = None
    total = 0
    try:
        e.wait_ready(180)
        with RpcClient(rpc_addr(e)) as c:
            for i in range(args.sessions):
                r = e.http.post("/v1/chat/completions", json={**chat_body(system, f"Which shelf holds record {i}?"),
                                                              "stream": False})
                r.raise_for_status()
                meta, data = c.state_get_bytes(0)
                tokens = meta["tokens"]
                if not first_tokens:
                    first_tokens = tokens
                else:
                    cp = _common(first_tokens, tokens)
                    common = cp if common is None else min(common, cp)
                n_tokens.append(len(tokens))
                total += len(data)
                t0 = time.perf_counter()
                store.put(meta, data)
                put_s.append(time.perf_counter() - t0)
                path = plain_dir / f"{i}.bin"
                t0 = time.perf_counter()
                tmpf = path.with_suffix(".tmp")
                with open(tmpf, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmpf, path)
                plain_w.append(time.perf_counter() - t0)
                if i % 16 == 15:
                    log(f"dedup: {i + 1}/{args.sessions} states stored")
    finally:
        e.stop()
    per_token = total / sum(n_tokens)
    common = common or 0
    ideal = per_token * (common + sum(n - common for n in n_tokens))
    st = store.stats()
    get_s: list[float] = []
    got_bytes = 0
    for key in [o["key"] for o in store.ls()]:
        t0 = time.perf_counter()
        _, data = store.get(key)
        get_s.append(time.perf_counter() - t0)
        got_bytes += len(data)
    plain_r: list[float] = []
    for i in range(len(n_tokens)):
        t0 = time.perf_counter()
        (plain_dir / f"{i}.bin").read_bytes()
        plain_r.append(time.perf_counter() - t0)
    shutil.rmtree(plain_dir, ignore_errors=True)
    gb = 1e9
    out = {"sessions": len(n_tokens), "tokens_per_state": {"min": min(n_tokens), "max": max(n_tokens)},
           "shared_tokens": common, "state_bytes_total": total, "bytes_per_token": per_token,
           "ideal_bytes": ideal, "stored_bytes": st["chunk_bytes"], "stored_over_ideal": st["chunk_bytes"] / ideal,
           "objects": st["objects"], "chunks": st["chunks"],
           "ingest_gbps": total / sum(put_s) / gb, "restore_gbps": got_bytes / sum(get_s) / gb,
           "plain_write_gbps": total / sum(plain_w) / gb, "plain_read_gbps": total / sum(plain_r) / gb}
    out["ingest_ratio"] = out["ingest_gbps"] / out["plain_write_gbps"]
    out["restore_ratio"] = out["restore_gbps"] / out["plain_read_gbps"]
    return out


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----- 3: TTFT from the Store -----------------------------------------------------------------------

def part_ttft(tmp: Path, store_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    prefix = {"store": {"dir": str(store_dir), "block_tokens": args.block, "fsync": True, "cap_bytes": 64 << 30}}
    defaults = {"model": MODEL, "n_parallel": 2, "n_ctx": 2 * (args.prefix_tokens + 512), "temperature": 0,
                **({"n_gpu_layers": 999} if args.gpu else {})}
    a = Engine(tmp, name="warm", defaults=defaults, extra={"prefix": prefix})
    b = Engine(tmp, name="cold", defaults=defaults, extra={"prefix": prefix})
    runs: list[dict[str, Any]] = []
    try:
        a.wait_ready(180)
        b.wait_ready(180)
        ttft(b, chat_body("Warm-up.", "Hello?"))  # first-request costs out of the way
        for run in range(args.runs):
            system = system_prompt(f"ttft-{run}", args.prefix_tokens)
            # A: the prompt computed once, then another conversation with the same prompt checkpoints the prefix
            ttft(a, chat_body(system, "Question one?", slot=0))
            ttft(a, chat_body(system, "Question two?", slot=1))
            store = Store(dir=store_dir, block_tokens=args.block, fsync=True, cap_bytes=64 << 30)
            deadline = time.monotonic() + 60
            while store.stats()["objects"] < run + 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the prefix was not checkpointed within 60 s")
                time.sleep(0.05)
            cold_system = system_prompt(f"cold-{run}", args.prefix_tokens)
            order = ["stored", "cold"] if run % 2 else ["cold", "stored"]
            got: dict[str, Any] = {}
            for side in order:
                s = system if side == "stored" else cold_system
                t, usage = ttft(b, chat_body(s, "Question three?"))
                got[side] = {"ttft_s": t, "prompt_tokens": usage.get("prompt_tokens"),
                             "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}
            got["ratio"] = got["stored"]["ttft_s"] / got["cold"]["ttft_s"]
            runs.append(got)
            log(f"ttft run {run + 1}/{args.runs}: stored {got['stored']['ttft_s'] * 1e3:.0f} ms "
                f"(cached {got['stored']['cached_tokens']}/{got['stored']['prompt_tokens']}), "
                f"cold {got['cold']['ttft_s'] * 1e3:.0f} ms, ratio {got['ratio']:.3f}")
    finally:
        a.stop()
        b.stop()
    return {"runs": runs, "stored_ms": median([r["stored"]["ttft_s"] * 1e3 for r in runs]),
            "cold_ms": median([r["cold"]["ttft_s"] * 1e3 for r in runs]),
            "ratio": median([r["ratio"] for r in runs]),
            "prompt_tokens": median([r["stored"]["prompt_tokens"] for r in runs]),
            "cached_tokens": median([r["stored"]["cached_tokens"] for r in runs])}


# ----- 4: overhead ----------------------------------------------------------------------------------

def part_overhead(tmp: Path, store_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    defaults = {"model": MODEL, "n_parallel": 1, "n_ctx": 2048, "temperature": 0,
                **({"n_gpu_layers": 999} if args.gpu else {})}
    on = Engine(tmp, name="store-on", defaults=defaults,
                extra={"prefix": {"store": {"dir": str(store_dir), "block_tokens": args.block, "fsync": True}}})
    off = Engine(tmp, name="store-off", defaults=defaults)
    times: dict[str, list[float]] = {"on": [], "off": []}
    try:
        on.wait_ready(180)
        off.wait_ready(180)
        for e in (on, off):
            ttft(e, chat_body("Warm-up.", "Hello?"))
        for i in range(args.overhead_requests):
            system = system_prompt(f"overhead-{i}", args.block * 3)  # long enough to be looked up, never stored
            for side in (("on", "off") if i % 2 else ("off", "on")):
                t, _ = ttft(on if side == "on" else off, chat_body(system, "Anything?"))
                times[side].append(t)
    finally:
        on.stop()
        off.stop()
    p50_on, p50_off = median(times["on"]) * 1e3, median(times["off"]) * 1e3
    return {"requests": args.overhead_requests, "p50_on_ms": p50_on, "p50_off_ms": p50_off,
            "delta_ms": p50_on - p50_off, "p90_on_ms": pct(times["on"], 0.9) * 1e3,
            "p90_off_ms": pct(times["off"], 0.9) * 1e3}


# ----- report -------------------------------------------------------------------------------------

def markdown(rep: dict[str, Any]) -> str:
    d, t, o = rep["dedup"], rep["ttft"], rep["overhead"]
    mib = 1 << 20
    where = "GPU" if rep["settings"]["gpu"] else "CPU"
    return "\n".join([
        f"## {rep['date']}: the Hydra Store — dedup, speed, TTFT from a stored prefix ({where})", "",
        f"Command: `{rep['command']}` ({rep['elapsed_s']:.0f} s)", "",
        f"Machine: {describe_machine(rep['machine'])}. hydrad: commit {rep['commit']}. Store on "
        f"`{rep['settings']['fs']}` (block {rep['settings']['block']} tokens, fsync on). Model {MODEL}.", "",
        f"**Dedup**: {d['sessions']} sessions sharing a system prompt ({d['shared_tokens']} shared tokens; states of "
        f"{d['tokens_per_state']['min']}–{d['tokens_per_state']['max']} tokens, {d['bytes_per_token'] / 1024:.1f} KiB "
        f"per token): {d['state_bytes_total'] / mib:,.0f} MiB of states stored in {d['stored_bytes'] / mib:,.1f} MiB "
        f"({d['chunks']} chunks); ideal (one prefix + every suffix) {d['ideal_bytes'] / mib:,.1f} MiB: "
        f"**stored ÷ ideal {d['stored_over_ideal']:.3f}** (goal ≤ 1.1).", "",
        "| speed (same states) | Store | plain file copy (write+fsync+rename / read) | Store ÷ plain (goal ≥ 0.5) |",
        "|---|---:|---:|---:|",
        f"| ingest (`put`: parse, cut, hash, write new chunks, manifest) | {d['ingest_gbps']:.2f} GB/s | "
        f"{d['plain_write_gbps']:.2f} GB/s | {d['ingest_ratio']:.2f} |",
        f"| restore (`get`: read and verify every chunk, reassemble) | {d['restore_gbps']:.2f} GB/s | "
        f"{d['plain_read_gbps']:.2f} GB/s | {d['restore_ratio']:.2f} |", "",
        f"**TTFT from the Store** ({len(t['runs'])} pairs, alternating; median prompt {t['prompt_tokens']:.0f} "
        f"tokens, {t['cached_tokens']:.0f} restored): engine B answering a prompt whose prefix engine A "
        f"checkpointed: median {t['stored_ms']:.0f} ms; the same engine on a cold prompt of the same length: "
        f"{t['cold_ms']:.0f} ms; **stored ÷ cold {t['ratio']:.3f}** (goal ≤ 0.2). Per pair: "
        + ", ".join(f"{r['ratio']:.3f}" for r in t["runs"]) + ".", "",
        f"**Overhead** on a request that needs nothing from the Store (a fresh {rep['settings']['block'] * 3}-token "
        f"prompt, looked up and missed), {o['requests']} alternating requests per engine: p50 TTFT with the "
        f"Store {o['p50_on_ms']:.1f} ms, without {o['p50_off_ms']:.1f} ms: **{o['delta_ms']:+.1f} ms** (goal ≤ +1 ms); "
        f"p90 {o['p90_on_ms']:.1f} / {o['p90_off_ms']:.1f} ms.", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64, help="sessions of the dedup part (default 64)")
    ap.add_argument("--prefix-tokens", type=int, default=2048, help="shared system prompt length (default 2048)")
    ap.add_argument("--block", type=int, default=256, help="the Store's block_tokens (default 256)")
    ap.add_argument("--runs", type=int, default=5, help="TTFT pairs (default 5)")
    ap.add_argument("--overhead-requests", type=int, default=30, help="requests per side for the overhead (default 30)")
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where the Store goes (default /dev/shm)")
    ap.add_argument("--gpu", action="store_true", help="offload every layer (n_gpu_layers 999) in parts 3 and 4")
    ap.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="hydra-bench-store-", dir=args.dir))
    tmp = Path(tempfile.mkdtemp(prefix="hydra-bench-store-"))
    try:
        log("part 1+2: dedup and speed")
        dedup = part_dedup(tmp, base / "dedup", args)
        log(f"dedup: stored/ideal {dedup['stored_over_ideal']:.3f}; ingest {dedup['ingest_ratio']:.2f}x, "
            f"restore {dedup['restore_ratio']:.2f}x of a plain copy")
        log("part 3: TTFT from the store")
        ttft_res = part_ttft(tmp, base / "ttft", args)
        log("part 4: overhead")
        overhead = part_overhead(tmp, base / "overhead", args)
        log(f"overhead: p50 {overhead['delta_ms']:+.2f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    fs = "tmpfs" if str(args.dir).startswith(("/dev/shm", "/run")) else str(args.dir)
    rep = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": ".venv/bin/python " + " ".join(shlex.quote(a) for a in [f"scripts/{Path(__file__).name}",
                                                                              *(argv if argv is not None else sys.argv[1:])]),
           "machine": machine(), "commit": git_describe(), "elapsed_s": time.monotonic() - t0,
           "settings": {"sessions": args.sessions, "prefix_tokens": args.prefix_tokens, "block": args.block,
                        "gpu": args.gpu, "fs": fs},
           "dedup": dedup, "ttft": ttft_res, "overhead": overhead}
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
    print(f"dedup stored/ideal {dedup['stored_over_ideal']:.3f}; ingest {dedup['ingest_ratio']:.2f}x, restore "
          f"{dedup['restore_ratio']:.2f}x plain; TTFT stored/cold {ttft_res['ratio']:.3f}; overhead "
          f"{overhead['delta_ms']:+.2f} ms")
    if args.markdown:
        print()
        print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())

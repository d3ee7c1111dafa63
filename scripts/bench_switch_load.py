#!/usr/bin/env python3
"""A profile switch under load: failed requests and re-prefilled tokens while sessions move.

A real coordinator and two real hydrad engines (SmolLM2-135M, ``--slots`` slots each, one thread each)
serve ``--sessions`` chat sessions, each a client thread taking turns back to back (a shared system
prompt of about 400 tokens, a growing conversation, ``--max-tokens`` per answer). Every
``--period`` seconds the coordinator switches profile: *twin* (both engines serve SmolLM2) ↔ *mixed*
(dev-a reloads to Gemma-3-270M, dev-b keeps SmolLM2), ``--switches`` times. Before dev-a's reload
drops its KV the coordinator moves the sessions it holds to dev-b over the merged ports; a turn that
finishes on dev-a during the reload is kept in the Store and restored on its next turn.

Per turn the client records status, engine, prompt and cached tokens, and latency. A turn's
**re-prefilled tokens** are the part of the previous turn's prompt its engine had to compute again:
``max(0, previous prompt_tokens − cached_tokens)`` (the previous answer and the new message are new
to the prompt, so they do not count). Reported: turns, failed requests (goal 0), re-prefilled tokens
(goal 0) in the steady phases and around the switches, sessions moved and restored, p50/p99 latency
steady vs within 10 s after a switch began.

    .venv/bin/python scripts/bench_switch_load.py --markdown

``--markdown`` prints a section for docs/benchmarks.md (it does not write the file).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import datetime as dt
import json
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_engine import describe_machine, git_describe, machine  # noqa: E402
from tests.support.coordinator import Coordinator  # noqa: E402
from tests.support.engine import Engine  # noqa: E402

SMOL, GEMMA = "smollm2-135m", "gemma3-270m"
SYSTEM = "You are a terse assistant. " + " ".join(f"Rule {i}: answer about item {i} in one word." for i in range(40))
WINDOW_S = 10.0  # a turn that starts within this long after a switch began counts as "around the switch"


def log(msg: str) -> None:
    print(f"[bench_switch_load {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def profiles(slots: int, n_ctx: int) -> dict[str, Any]:
    params = {"n_parallel": slots, "n_ctx": n_ctx, "n_threads": 1}
    return {"profiles": {"twin": {"engines": {n: {"model": SMOL, "params": params} for n in ("dev-a", "dev-b")}},
                         "mixed": {"engines": {"dev-a": {"model": GEMMA, "params": params},
                                               "dev-b": {"model": SMOL, "params": params}}}},
            "default": "twin"}


class Client(threading.Thread):
    """One session: turns back to back until told to stop; every turn recorded."""

    def __init__(self, url: str, session: str, max_tokens: int, stop: threading.Event, t0: float,
                 max_session_tokens: int) -> None:
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=url, timeout=300)
        self.name_, self.max_tokens, self.stop_flag, self.t0 = session, max_tokens, stop, t0
        self.max_session_tokens = max_session_tokens
        self.session = session
        self.turns: list[dict[str, Any]] = []

    def run(self) -> None:
        conv = [{"role": "system", "content": SYSTEM}]
        prev_prompt = 0
        i = chats = 0
        while not self.stop_flag.is_set():
            if prev_prompt > self.max_session_tokens:
                # a user starting a new chat: what a fast engine reaches within the run would otherwise
                # outgrow the pool's context (every session on one engine in the mixed profile)
                chats += 1
                self.session, conv, prev_prompt = f"{self.name_}.{chats}", conv[:1], 0
            i += 1
            conv.append({"role": "user", "content": f"Item {i}?"})
            started = time.monotonic()
            rec: dict[str, Any] = {"session": self.session, "turn": i, "t": started - self.t0}
            try:
                r = self.http.post("/v1/chat/completions", json={
                    "model": SMOL, "messages": conv, "max_tokens": self.max_tokens, "temperature": 0,
                    "session_id": self.session})
                rec.update(status=r.status_code, latency_s=time.monotonic() - started,
                           engine=r.headers.get("x-hydra-engine"))
                if r.status_code == 200:
                    body = r.json()
                    usage = body["usage"]
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
                    rec.update(prompt_tokens=usage["prompt_tokens"], cached_tokens=cached,
                               reprefilled=max(0, prev_prompt - cached) if prev_prompt else 0)
                    prev_prompt = usage["prompt_tokens"]
                    conv.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
                else:
                    rec["error"] = r.text[:300]
                    conv.pop()
            except httpx.HTTPError as exc:
                rec.update(status=0, latency_s=time.monotonic() - started, error=str(exc)[:300])
                conv.pop()
            self.turns.append(rec)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    c = Coordinator(tmp, profiles=profiles(args.slots, args.n_ctx), heartbeat_interval_s=0.5,
                    extra={"first_token_timeout_s": 300, "load_timeout_s": 300})
    engines: list[Engine] = []
    stop = threading.Event()
    clients: list[Client] = []
    switches: list[dict[str, Any]] = []
    try:
        c.wait_ready()
        for name in ("dev-a", "dev-b"):
            engines.append(Engine(tmp, name=name, defaults={"n_threads": 1},
                                  extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)}))
        c.http.timeout = httpx.Timeout(600)
        c.wait_serving({"dev-a": SMOL, "dev-b": SMOL}, timeout=300)
        t0 = time.monotonic()
        clients = [Client(c.url, f"s-{i}", args.max_tokens, stop, t0, args.max_session_tokens)
                   for i in range(args.sessions)]
        for cl in clients:
            cl.start()
        log(f"{args.sessions} sessions running; first switch in {args.period:.0f} s")
        target = "mixed"
        for k in range(args.switches):
            time.sleep(args.period)
            at = time.monotonic() - t0
            log(f"switch {k + 1}/{args.switches}: → {target}")
            r = c.http.post("/admin/profile", json={"name": target})
            switches.append({"to": target, "t": at, "seconds": time.monotonic() - t0 - at, "status": r.status_code,
                             "body": r.json() if r.headers.get("content-type", "").startswith("application/json")
                             else r.text[:300]})
            target = "twin" if target == "mixed" else "mixed"
        time.sleep(args.period)
        stop.set()
        for cl in clients:
            cl.join(300)
        sessions = c.http.get("/admin/sessions").json()
        if args.log:
            Path(args.log).write_text(c.log())
    finally:
        stop.set()
        for e in engines:
            e.stop()
        c.stop()
    turns = [t for cl in clients for t in cl.turns]
    near = [t for t in turns if any(0 <= t["t"] - s["t"] <= WINDOW_S for s in switches)]
    steady = [t for t in turns if t not in near]

    def summary(ts: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [t for t in ts if t.get("status") == 200]
        return {"turns": len(ts), "failed": len(ts) - len(ok), "reprefilled": sum(t.get("reprefilled", 0) for t in ok),
                "turns_reprefilling": sum(1 for t in ok if t.get("reprefilled", 0) > 0),
                "p50_s": pct([t["latency_s"] for t in ok], 0.5), "p99_s": pct([t["latency_s"] for t in ok], 0.99)}

    return {"turns": turns, "switches": switches, "sessions": sessions, "steady": summary(steady),
            "switching": summary(near), "all": summary(turns),
            "errors": sorted({t.get("error", "") for t in turns if t.get("status") != 200})[:10]}


def markdown(rep: dict[str, Any]) -> str:
    s, st, sw, al = rep["settings"], rep["steady"], rep["switching"], rep["all"]
    ses = rep["sessions"]
    where = "GPU host, both engines on the one GPU" if rep["machine"].get("gpus") else "CPU"
    lines = [f"## {rep['date']}: a profile switch under load, with sessions moving ({where})", "",
             f"Command: `{rep['command']}` ({rep['elapsed_s']:.0f} s)", "",
             f"Machine: {describe_machine(rep['machine'])}. hydrad: commit {rep['commit']}. Coordinator + dev-a + dev-b "
             f"(one thread each, {s['slots']} slots, n_ctx {s['n_ctx']}); {s['sessions']} chat sessions taking turns "
             f"back to back ({s['max_tokens']} tokens per answer, a ~400-token system prompt); {len(rep['switches'])} "
             f"profile switches twin ↔ mixed every {s['period']:.0f} s (dev-a reloads SmolLM2 ↔ Gemma-3).", "",
             "| turns | count | failed (goal 0) | re-prefilled tokens (goal 0) | turns that re-prefilled | p50 / p99 latency (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, x in (("steady", st), (f"within {WINDOW_S:.0f} s of a switch", sw), ("all", al)):
        lines.append(f"| {name} | {x['turns']} | {x['failed']} | {x['reprefilled']} | {x['turns_reprefilling']} | "
                     f"{x['p50_s']:.2f} / {x['p99_s']:.2f} |")
    lines += ["", f"Sessions moved engine to engine: {ses.get('moved')}; restored from the Store: {ses.get('restored')} "
              f"(restore failures {ses.get('restore_failed')}); turns kept: {ses.get('kept')}. Switch times: "
              + ", ".join(f"{x['seconds']:.1f} s" for x in rep["switches"]) + "."]
    if rep["errors"]:
        lines += ["", "Errors seen: " + "; ".join(f"`{e}`" for e in rep["errors"])]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    ap.add_argument("--slots", type=int, default=4, help="slots per engine (default 4)")
    ap.add_argument("--n-ctx", type=int, default=16384, help="engines' n_ctx (default 16384)")
    ap.add_argument("--max-tokens", type=int, default=12, help="tokens per answer (default 12)")
    ap.add_argument("--max-session-tokens", type=int, default=3000,
                    help="a session whose prompt passes this many tokens is replaced by a new one, as a user starts "
                         "a new chat, so that all sessions fit one engine's n_ctx (default 3000)")
    ap.add_argument("--switches", type=int, default=4, help="profile switches (default 4)")
    ap.add_argument("--period", type=float, default=30.0, help="seconds between switches (default 30)")
    ap.add_argument("--json", metavar="PATH", help="write every turn as JSON")
    ap.add_argument("--log", metavar="PATH", help="write the coordinator's log there (what moved, what did not and why)")
    ap.add_argument("--markdown", action="store_true", help="print a section for docs/benchmarks.md")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hydra-bench-switch-") as tmp:
        result = run(args, Path(tmp))
    rep = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
           "commit": git_describe(), "elapsed_s": time.monotonic() - t0,
           "command": ".venv/bin/python scripts/bench_switch_load.py "
                      + shlex.join(argv if argv is not None else sys.argv[1:]),
           "settings": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")}, **result}
    log(f"all: {rep['all']}; sessions: {rep['sessions']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=str))
    if args.markdown:
        print(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

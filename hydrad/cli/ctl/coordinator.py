"""``hydractl engines``, ``profile`` and ``route``: the coordinator's admin API (``/admin/*``,
default ``http://127.0.0.1:9000`` or ``$HYDRA_COORDINATOR_URL``); a profile switch whose load
fails exits 4."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from hydrad.cli.common import (
    COORDINATOR_URL, COORDINATOR_URL_ENV, EXIT_LOAD_FAILED, EXIT_NOT_SERVING, EXIT_OK, EXIT_REJECTED, CliError,
)
from hydrad.cli.ctl.clients import POLL_INTERVAL_S, CoordinatorClient, coordinator, split_url
from hydrad.cli.ctl.engine import describe_applied
from hydrad.cli.ctl.text import percent, table, yes


def _tps(value: Any) -> str:
    return f"{float(value):.1f}" if isinstance(value, (int, float)) and value > 0 else "-"


def _stage(e: dict[str, Any]) -> str:
    stage = str(e.get("stage") or "?")
    fetch = e.get("fetch")
    if isinstance(fetch, dict) and fetch.get("text"):  # the model's file comes first
        stage += f" ({fetch['text']})"
    elif e.get("progress") is not None and stage not in ("ready", "idle"):
        stage += f" {percent(e['progress'])}"
    return stage


def _serving(e: dict[str, Any]) -> str:
    """The model served, and the one on its way in when a load is under way."""
    model, loading = e.get("model"), e.get("loading_model")
    if loading and loading != model:
        return f"{model or '-'} -> {loading}"
    return model or "-"


def _mode(e: dict[str, Any]) -> str:
    """The COMBINE role the engine reports, with its pair by name: ``SOLO``, ``COMBINE head→p100``,
    ``COMBINE peer←5060ti``, ``COMBINE head→a peer←b``. From a coordinator that names no pair,
    the engine's own addresses (a head's peers' RPC ports, a peer's heads' client addresses)."""
    roles = str(e.get("role") or "solo").split("+")
    parts = []
    if "head" in roles:
        peers = e["pair_peers"] if isinstance(e.get("pair_peers"), list) else e.get("peers") or []
        parts.append("head→" + (",".join(str(p) for p in peers) or "?"))
    if "peer" in roles:
        heads = e["pair_heads"] if isinstance(e.get("pair_heads"), list) else e.get("serving") or []
        parts.append("peer←" + (",".join(str(h) for h in heads) or "?"))
    mode = str(e.get("mode") or "solo").upper()
    return f"{mode} {' '.join(parts)}" if parts else mode


def _plain(text: str, encoding: str | None) -> str:
    """``text`` with ASCII arrows when the terminal's encoding cannot show →/←."""
    try:
        "→←".encode(encoding or "utf-8")
    except (LookupError, UnicodeEncodeError):
        return text.replace("→", "->").replace("←", "<-")
    return text


# ----- engines ---------------------------------------------------------------------------

def format_engines(data: dict[str, Any], url: str) -> str:
    engines = data.get("engines") or []
    alive = sum(1 for e in engines if e.get("alive"))
    lines = [f"coordinator {url}, profile {data.get('profile') or '-'}, {alive}/{len(engines)} engines alive"]
    if not engines:
        return "\n".join(lines + ["no engine has registered"])
    # "device": the GPU(s) the engine is bound to (its `device` setting), "all" when it sees every GPU
    # "mode": the COMBINE role each engine reports itself (not the profile's intent), its pair by name
    rows: list[tuple[str, ...]] = [("engine", "alive", "device", "stage", "model", "mode", "slots", "queue",
                                    "decode tok/s", "heartbeat")]
    notes: list[str] = []
    for e in engines:
        total = int(e.get("slots_total") or 0)
        slots = f"{e.get('slots_busy', 0)}/{total}" if total else "-"
        age = e.get("last_seen_s")
        rows.append((str(e.get("name")), yes(e.get("alive")), str(e.get("device") or "all"), _stage(e), _serving(e),
                     _mode(e), slots, f"{e.get('queued', 0)}/{e.get('max_queue', '-')}", _tps(e.get("decode_tps")),
                     f"{float(age):.1f}s ago" if isinstance(age, (int, float)) else "-"))
        if not e.get("alive") and e.get("down_reason"):
            notes.append(f"{e.get('name')}: down: {e['down_reason']}")
        if e.get("configuring"):
            notes.append(f"{e.get('name')}: being configured ({e['configuring']})")
        if e.get("last_error"):
            notes.append(f"{e.get('name')}: last error: {e['last_error']}")
        last = e.get("last_configure") or {}
        if last.get("ok") is False:
            notes.append(f"{e.get('name')}: configure of {last.get('model') or '-'} failed ({last.get('why')}): "
                         f"{last.get('error') or last.get('code') or '?'}")
    return "\n".join(lines + table(rows) + notes)


def cmd_engines(args: argparse.Namespace) -> int:
    coord = coordinator(args)
    try:
        data = coord.engines()
    finally:
        coord.close()
    print(json.dumps(data, indent=2) if args.json else _plain(format_engines(data, coord.url), sys.stdout.encoding))
    return EXIT_OK if any(e.get("alive") for e in data.get("engines") or []) else EXIT_NOT_SERVING


# ----- profile ---------------------------------------------------------------------------

def _describe_switch(sw: dict[str, Any]) -> str:
    frm = sw.get("previous") or "-"
    state = "ok" if sw.get("ok") else f"failed ({', '.join(sw.get('failed') or []) or '?'})"
    return f"{frm} -> {sw.get('profile')}: {state} in {float(sw.get('seconds') or 0.0):.2f}s"


def format_profile(data: dict[str, Any]) -> str:
    lines = [f"profile {data.get('active') or '-'} ({data.get('state', '?')})"]
    engines = data.get("engines") or {}
    if engines:
        rows: list[tuple[str, ...]] = [("engine", "alive", "target", "serving", "stage", "matches")]
        for name, t in engines.items():
            entry = t.get("entry") or {}
            target = entry.get("model") or f"({str(entry.get('mode') or 'SOLO').upper()})"
            matches = yes(t.get("matches")) + (f", configuring ({t['configuring']})" if t.get("configuring") else "")
            rows.append((name, yes(t.get("alive")), target, t.get("model") or "-", t.get("stage") or "-", matches))
        lines += table(rows)
    if data.get("last_switch"):
        lines.append(f"last switch: {_describe_switch(data['last_switch'])}")
    known = data.get("profiles") or {}
    if known:
        lines.append("profiles: " + ", ".join(f"{n} ({d})" if d else n for n, d in known.items()))
    return "\n".join(lines)


class SwitchProgress:
    """One line per engine whenever what it is doing changes (loads in 10% steps)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.seen: dict[str, tuple[Any, ...]] = {}

    def update(self, data: dict[str, Any]) -> None:
        progress = data.get("progress") or {}
        for name, t in (data.get("engines") or {}).items():
            p = progress.get(name) or {}
            frac = p.get("progress")
            key = (t.get("configuring"), t.get("stage"), t.get("model"), p.get("model"),
                   int(float(frac) * 10) if frac is not None else None)
            if self.seen.get(name) == key:
                continue
            first = name not in self.seen
            self.seen[name] = key
            if t.get("configuring") and not p:
                text = f"{name}: configuring (serving {t.get('model') or 'nothing'})"
            elif t.get("configuring"):
                text = f"{name}: {p.get('stage') or '?'} {p.get('model') or ''} {percent(frac or 0.0)}"
                if t.get("model") and t.get("model") != p.get("model"):
                    text += f" (still serving {t['model']})"
            elif first:
                continue  # an engine the switch leaves alone
            else:
                text = f"{name}: {t.get('stage') or '?'}, serving {t.get('model') or 'nothing'}"
            self.stream.write(text + "\n")
            self.stream.flush()


def _switch_result(name: str, sw: dict[str, Any]) -> int:
    for engine, r in sorted((sw.get("engines") or {}).items()):
        if r.get("ok"):
            load = r.get("load_seconds")
            how = f"loaded in {float(load):.2f}s" if load is not None else describe_applied(r)
            print(f"  {engine}: {r.get('model') or '-'}, {how} (configure {float(r.get('seconds') or 0.0):.2f}s)")
        else:
            print(f"  {engine}: {r.get('model') or '-'} FAILED: {r.get('error') or r.get('code') or '?'}")
    for engine in sw.get("unchanged") or []:
        print(f"  {engine}: unchanged")
    for engine in sw.get("absent") or []:
        print(f"  {engine}: not alive; it gets the profile when it registers")
    for engine, why in sorted((sw.get("errors") or {}).items()):
        print(f"  {engine}: cannot be configured: {why}")
    seconds = float(sw.get("seconds") or 0.0)
    if not sw.get("ok"):
        raise CliError(f"switch to {name} failed after {seconds:.2f}s: {', '.join(sw.get('failed') or [])}",
                       EXIT_LOAD_FAILED)
    print(f"switched to {name} in {seconds:.2f}s")
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    url, rest = split_url(args.args, args.default_coordinator_url)
    if len(rest) > 1:
        raise CliError(f"expected at most one profile name, got {' '.join(rest)}", EXIT_REJECTED)
    coord = CoordinatorClient(url, args.timeout)
    try:
        before = coord.profile()
        if not rest:
            print(json.dumps(before, indent=2) if args.json else format_profile(before))
            return EXIT_OK
        name = rest[0]
        previous = (before.get("last_switch") or {}).get("started")
        coord.switch(name)
        print(f"switching to {name} (from {before.get('active') or '-'})", flush=True)
        progress = SwitchProgress(sys.stderr)
        try:
            while True:
                data = coord.profile()
                sw = data.get("last_switch") or {}
                if data.get("state") != "switching" and sw.get("profile") == name and sw.get("started") != previous:
                    break
                progress.update(data)
                time.sleep(POLL_INTERVAL_S)
        except KeyboardInterrupt:
            print(f"stopped following the switch to {name}; it goes on in the coordinator", file=sys.stderr)
            return 130
        if args.json:
            print(json.dumps(sw, indent=2))
            return EXIT_OK if sw.get("ok") else EXIT_LOAD_FAILED
        return _switch_result(name, sw)
    finally:
        coord.close()


# ----- route -----------------------------------------------------------------------------

def format_route(d: dict[str, Any]) -> str:
    req = d.get("request") or {}
    rows: list[tuple[str, Any]] = [
        ("engine", d.get("engine") or "- (none)"),
        ("model", d.get("model") or "-"),
        ("step", d.get("step") or "-"),
        ("reason", d.get("reason") or "-"),
        ("request", f"~{req.get('prompt_tokens', '?')} prompt tokens, max_tokens {req.get('max_tokens', '?')}, "
                    f"session {req.get('session_id') or '-'}, prefix {req.get('prefix_hash') or '-'}"),
    ]
    lines = [f"{name:<10} {value}" for name, value in rows]
    candidates = d.get("candidates") or []
    lines.append(f"candidates ({len(candidates)}, cheapest first):")
    if candidates:
        cost_rows: list[tuple[str, ...]] = [("engine", "cost s", "wait s", "load s", "prefill s", "warm")]
        for c in candidates:
            # lukewarm: the session's KV is in the Store; prefill s then includes its restore
            kv = "lukewarm" if c.get("lukewarm") else yes(c.get("warm"))
            cost_rows.append((str(c.get("engine")), *(f"{float(c.get(k) or 0.0):.4f}"
                                                  for k in ("cost_s", "wait_s", "load_s", "prefill_s")),
                          kv))
        lines += ["  " + line for line in table(cost_rows)]
    rejected = d.get("rejected") or {}
    lines.append(f"rejected ({len(rejected)}):")
    width = max((len(n) for n in rejected), default=0)
    lines += [f"  {n:<{width}}  {why}" for n, why in rejected.items()]
    if d.get("engine") is None and d.get("loading"):
        lines.append(f"a request now would wait for {', '.join(d['loading'])}, which is loading {d.get('model')}")
    split = d.get("split") or {}
    if split:
        plan = split.get("plan")
        lines.append(f"split      {'yes' if plan else 'no'}: {split.get('reason') or '-'}")
        if plan:
            lines.append(f"  prefill {plan.get('prefill')} ({plan.get('prefill_model')}) {float(plan.get('prefill_s') or 0):.4f} s"
                         f" + transfer {float(plan.get('transfer_s') or 0):.4f} s ({plan.get('kv_bytes')} bytes)"
                         f" + decode {plan.get('decode')} {float(plan.get('decode_s') or 0):.4f} s"
                         f" = {float(plan.get('total_s') or 0):.4f} s; {plan.get('single')} alone"
                         f" {float(plan.get('single_s') or 0):.4f} s")
        t = split.get("transfers") or {}
        if t.get("transfers"):
            lines.append(f"  transfers measured: {t.get('transfers')}, {float(t.get('bytes_per_s') or 0) / 1e6:.0f} MB/s"
                         f" + {float(t.get('fixed_s') or 0) * 1000:.1f} ms each")
    return "\n".join(lines)


def cmd_route(args: argparse.Namespace) -> int:
    url, rest = split_url(args.args, args.default_coordinator_url)
    if not rest:
        raise CliError("give the prompt to route", EXIT_REJECTED)
    text = " ".join(rest)
    body: dict[str, Any] = {"prompt": text} if args.completion else {"messages": [{"role": "user", "content": text}]}
    if args.model:
        body["model"] = args.model
    if args.session:
        body["session_id"] = args.session
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    coord = CoordinatorClient(url, args.timeout)
    try:
        decision = coord.route(body)
    finally:
        coord.close()
    if args.json:
        print(json.dumps(decision, indent=2))
    elif args.explain:
        print(format_route(decision))
    else:
        print(decision.get("engine") or f"none: {decision.get('reason')}")
    return EXIT_OK if decision.get("engine") else EXIT_NOT_SERVING


# ----- the command line -------------------------------------------------------------------

def add_parsers(sub: Any, common: argparse.ArgumentParser, rpc_auth: argparse.ArgumentParser) -> None:
    """engines, profile and route; ``common`` adds --timeout."""
    coord_help = f"coordinator URL (default ${COORDINATOR_URL_ENV} or {COORDINATOR_URL})"
    en = sub.add_parser("engines", parents=[common], help="the coordinator's engines as a table",
                        description="Show GET /admin/engines of the coordinator: every engine with alive, stage, "
                                    "model, mode (SOLO, or COMBINE with the role it reports and its pair: 'COMBINE "
                                    "head->p100', 'COMBINE peer<-5060ti'), slots busy/total, queue, measured decode "
                                    "tok/s and the age of its last heartbeat. Exit 0 when some engine is alive, 3 "
                                    "when none is.")
    en.add_argument("url", nargs="?", metavar="URL", help=coord_help)
    en.add_argument("--json", action="store_true", help="print the raw /admin/engines JSON")
    en.set_defaults(func=cmd_engines)

    pr = sub.add_parser("profile", parents=[common], help="show the active profile, or switch to another",
                        description="Without NAME: the active profile, each engine's target and whether it matches.\n"
                                    "With NAME: switch the pool to that profile and follow it until every engine\n"
                                    "is done, printing progress and the total time (exit 4 when a load failed).",
                        epilog="examples:\n  hydractl profile\n  hydractl profile swapped\n"
                               "  hydractl profile http://coord:9000 dense",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("args", nargs="*", metavar="[URL] [NAME]", help=f"profile to switch to, after an optional {coord_help}")
    pr.add_argument("--json", action="store_true", help="print the raw JSON (the profile, or the switch's result)")
    pr.set_defaults(func=cmd_profile)

    ro = sub.add_parser("route", parents=[common], help="which engine a request would go to, and why",
                        description="Ask the coordinator where a chat request with PROMPT as its user message would\n"
                                    "be routed now (POST /admin/route; nothing is generated). Prints the engine;\n"
                                    "--explain adds the step, the reason, every candidate's cost, every\n"
                                    "rejected engine with why, and the prefill/decode split's plan (or why\n"
                                    "there is none). Exit 0 when an engine was chosen, 3 when none.",
                        epilog="example:\n  hydractl route --explain --model smollm2-135m --session s1 'Hello there'",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ro.add_argument("args", nargs="*", metavar="[URL] PROMPT", help=f"the prompt, after an optional {coord_help}")
    ro.add_argument("--explain", action="store_true", help="show step, reason, candidates, rejections and the split")
    ro.add_argument("--model", metavar="M", help="model to route for (default: the one model the pool serves, else its default_model)")
    ro.add_argument("--session", metavar="S", help="session id (session affinity)")
    ro.add_argument("--max-tokens", type=int, metavar="N", help="max_tokens of the request (default 256)")
    ro.add_argument("--completion", action="store_true", help="route a completion (prompt) instead of a chat turn")
    ro.add_argument("--json", action="store_true", help="print the raw decision JSON")
    ro.set_defaults(func=cmd_route, intermixed=True)

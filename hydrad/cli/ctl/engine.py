"""``hydractl status``, ``configure`` and ``config``: one engine, over its HTTP API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

import yaml

from hydrad.cli.common import EXIT_LOAD_FAILED, EXIT_NOT_SERVING, EXIT_OK, EXIT_REJECTED, CliError
from hydrad.cli.ctl.clients import DEFAULT_URL, POLL_INTERVAL_S, URL_ENV, EngineClient, engine_token, split_url
from hydrad.cli.ctl.text import percent


# ----- command-line values ---------------------------------------------------------------

def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def parse_value(raw: str) -> Any:
    """Read ``raw`` as a YAML scalar or flow collection, falling back to the text itself.

    YAML 1.1 reads ``on``/``off``/``yes``/``no`` as booleans, which would turn
    ``flash_attn=on`` into ``true``; only the literal words true/false become booleans.
    Text YAML cannot read (a Jinja chat template) or reads as a non-JSON type (a date)
    is sent as the string typed.
    """
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
        return raw
    return value if _is_json(value) else raw


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["n_ctx=4096", "model=null"]`` -> ``{"n_ctx": 4096, "model": None}``; the last repeat wins."""
    payload: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"expected key=value, got {item!r}", EXIT_REJECTED)
        payload[key] = parse_value(raw)
    return payload


# ----- status ----------------------------------------------------------------------------

def format_health(health: dict[str, Any], url: str) -> str:
    """One aligned block; absent facts show as ``-`` so the shape never changes."""
    stage = str(health.get("stage", "?"))
    if health.get("progress") is not None:
        stage += f" {percent(health['progress'])}"
    slots = health.get("slots") or {}
    rows = [
        ("engine", f"{health.get('engine', '-')}  ({url})"),
        ("status", health.get("status", "-")),
        ("stage", stage),
        ("model", health.get("model") or "-"),
        ("generation", health.get("generation") or "-"),
        ("slots", f"{slots.get('busy', '-')}/{slots.get('total', '-')} busy"),
        ("queued", slots.get("queued", "-")),
    ]
    if health.get("load_id") is not None:
        rows.append(("load", health["load_id"]))
    if health.get("last_error"):
        rows.append(("last_error", health["last_error"]))
    return "\n".join(f"{name:<11} {value}" for name, value in rows)


def cmd_status(args: argparse.Namespace) -> int:
    engine = EngineClient(args.url or args.default_url, args.timeout, engine_token(args))
    try:
        code, health = engine.health()
    finally:
        engine.close()
    print(json.dumps(health, indent=2) if args.json else format_health(health, engine.url))
    return EXIT_OK if code == 200 and health.get("status") == "ok" else EXIT_NOT_SERVING


# ----- configure -------------------------------------------------------------------------

class ProgressLine:
    """Load progress on a stream: rewritten in place on a terminal, one line per 10% in a log."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._bucket = -1
        self._open = False

    def update(self, rec: dict[str, Any]) -> None:
        progress = float(rec.get("progress") or 0.0)
        text = f"load {rec.get('id')} {rec.get('model')}: {rec.get('phase')} {percent(progress)}"
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self._open = True
        elif int(progress * 10) > self._bucket:
            self._bucket = int(progress * 10)
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


def follow_load(engine: EngineClient, load_id: int, progress: ProgressLine) -> dict[str, Any]:
    """Poll a load until it is done or failed; returns its final record."""
    try:
        while True:
            rec = engine.load(load_id)
            progress.update(rec)
            if rec.get("phase") in ("done", "failed"):
                return rec
            time.sleep(POLL_INTERVAL_S)
    finally:
        progress.close()


def describe_applied(result: dict[str, Any]) -> str:
    """``applied T2 (rebuild_context): n_ctx in 0.055s`` or ``no change``."""
    if result.get("tier") in (None, "none"):
        return "no change"
    line = f"applied {result['tier']} ({result.get('action')}): {', '.join(result.get('changed') or []) or '-'}"
    if result.get("seconds") is not None:
        line += f" in {float(result['seconds']):.3f}s"
    return line


def _start_load(engine: EngineClient, result: dict[str, Any], payload: dict[str, Any], wait: bool) -> int:
    load_id = int(result["load_id"])
    rec = engine.load(load_id)
    print(f"loading {rec.get('model') or payload.get('model')} (load {load_id})", flush=True)
    if not wait:
        return EXIT_OK
    try:
        rec = follow_load(engine, load_id, ProgressLine(sys.stderr))
    except KeyboardInterrupt:
        print(f"stopped following load {load_id}; it goes on in the engine", file=sys.stderr)
        return 130
    if rec.get("phase") == "failed":
        raise CliError(f"load {load_id} of {rec.get('model')} failed: {rec.get('error')}", EXIT_LOAD_FAILED)
    print(f"loaded {rec.get('model')} in {float(rec.get('seconds') or 0.0):.2f}s (load {load_id})")
    return EXIT_OK


def cmd_configure(args: argparse.Namespace) -> int:
    url, items = split_url(args.items, args.default_url)
    if not items:
        raise CliError("nothing to configure: give at least one key=value", EXIT_REJECTED)
    payload = parse_assignments(items)
    engine = EngineClient(url, args.timeout, engine_token(args))
    try:
        resp = engine.configure(payload)
        result = engine.checked(resp)
        if resp.status_code == 202 and result.get("load_id") is not None:
            return _start_load(engine, result, payload, wait=not args.no_wait)
        print(describe_applied(result))
        return EXIT_OK
    finally:
        engine.close()


# ----- config ----------------------------------------------------------------------------

def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def format_config(config: dict[str, Any]) -> str:
    """Header naming the engine and model, then ``name  value  source  tier`` in aligned columns."""
    rows = [("name", "value", "source", "tier")]
    for name, p in (config.get("params") or {}).items():
        rows.append((name, _show(p.get("value")), str(p.get("source")), str(p.get("tier"))))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"engine {config.get('engine', '-')}, model {config.get('model') or '-'}"]
    lines += [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    return "\n".join(lines)


def cmd_config(args: argparse.Namespace) -> int:
    engine = EngineClient(args.url or args.default_url, args.timeout, engine_token(args))
    try:
        config = engine.config()
    finally:
        engine.close()
    print(json.dumps(config, indent=2) if args.json else format_config(config))
    return EXIT_OK


# ----- the command line -------------------------------------------------------------------

def add_parsers(sub: Any, common: argparse.ArgumentParser, rpc_auth: argparse.ArgumentParser) -> None:
    """status, configure and config; ``common`` adds --timeout, ``rpc_auth`` the engines' token."""
    url_help = f"engine URL (default ${URL_ENV} or {DEFAULT_URL})"
    st = sub.add_parser("status", parents=[common, rpc_auth], help="show the engine's stage, model and slots",
                        description="Show /health as a block. Exit 0 when serving, 3 when reachable but not "
                                    "serving (idle, loading, stopping), 1 when unreachable.")
    st.add_argument("url", nargs="?", metavar="URL", help=url_help)
    st.add_argument("--json", action="store_true", help="print the raw /health JSON")
    st.set_defaults(func=cmd_status)

    co = sub.add_parser(
        "configure", parents=[common, rpc_auth], help="change runtime parameters (key=value ...)",
        description="POST key=value pairs to /control/configure. Values are read as YAML:\n"
                    "n_ctx=4096 is a number, tensor_split=[0.6,0.4] a list, flash_attn=on stays the string 'on';\n"
                    "key=null drops a runtime override, and model=null unloads the model.\n"
                    "A model change (T3) is followed until the load ends.",
        epilog="examples:\n  hydractl configure temperature=0.3\n"
               "  hydractl configure http://gpu1:8080 model=gemma3-270m n_ctx=4096",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    co.add_argument("items", nargs="*", metavar="[URL] key=value",
                    help=f"parameters, after an optional http(s):// {url_help}")
    co.add_argument("--no-wait", action="store_true", help="return as soon as a model load has started")
    co.set_defaults(func=cmd_configure)

    cf = sub.add_parser("config", parents=[common, rpc_auth], help="show effective parameters and where each came from",
                        description="Show /control/config as a table: name, value, source "
                                    "(default, model, yaml, runtime) and tier (T1 per request .. T3 reload).")
    cf.add_argument("url", nargs="?", metavar="URL", help=url_help)
    cf.add_argument("--json", action="store_true", help="print the raw /control/config JSON")
    cf.set_defaults(func=cmd_config)

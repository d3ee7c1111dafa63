"""``hydractl``: look at and reconfigure one running engine from a shell.

The engine's HTTP plane already says everything; this tool spares operators hand-written
JSON and curl loops, and turns the answers into exit codes that scripts can branch on:

    0  done / serving
    1  the engine cannot be reached (or answered something that is not Hydra)
    2  the engine refused the request (a 4xx: bad field, unknown model, busy, forbidden)
    3  reachable but not serving (idle, loading, stopping)
    4  a model load failed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, TextIO

import httpx
import yaml

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "HYDRA_ENGINE_URL"
POLL_INTERVAL_S = 0.2

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_REJECTED = 2
EXIT_NOT_SERVING = 3
EXIT_LOAD_FAILED = 4


class CliError(Exception):
    """A failure already phrased for the operator; ``main`` prints it and exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


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


def split_url(args: list[str], default: str) -> tuple[str, list[str]]:
    """A leading http(s):// argument is the engine URL; everything else stays."""
    if args and args[0].startswith(("http://", "https://")):
        return args[0], args[1:]
    return default, args


def normalize_url(url: str) -> str:
    """Accept ``host:port`` as well as a full URL; drop a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


# ----- talking to the engine -------------------------------------------------------------

class EngineClient:
    """The few HTTP calls hydractl makes, with every failure turned into a CliError."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = normalize_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return self._http.request(method, path, json=payload)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise CliError(f"cannot reach the engine at {self.url} ({reason})", EXIT_UNREACHABLE) from None
        except httpx.InvalidURL as exc:
            raise CliError(f"bad engine URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None

    def body(self, resp: httpx.Response) -> dict[str, Any]:
        """The JSON object of a response; anything else means this is not a Hydra engine."""
        try:
            data = resp.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise CliError(f"{self.url}{resp.request.url.path} answered {resp.status_code} without a JSON object; "
                           "is this a Hydra engine?", EXIT_UNREACHABLE)
        return data

    def checked(self, resp: httpx.Response) -> dict[str, Any]:
        """The body of a successful response; an OpenAI error body becomes a CliError."""
        data = self.body(resp)
        if resp.is_success:
            return data
        err = data.get("error")
        message = err.get("message") if isinstance(err, dict) else None
        message = message or f"HTTP {resp.status_code}"
        code = EXIT_REJECTED if resp.is_client_error else EXIT_UNREACHABLE
        raise CliError(f"engine refused ({resp.status_code}): {message}", code)

    def health(self) -> tuple[int, dict[str, Any]]:
        resp = self.request("GET", "/health")
        data = self.body(resp)
        if "stage" not in data:
            raise CliError(f"{self.url}/health answered {resp.status_code} without a stage; is this a Hydra engine?",
                           EXIT_UNREACHABLE)
        return resp.status_code, data

    def load(self, load_id: int) -> dict[str, Any]:
        resp = self.request("GET", f"/control/loads/{load_id}")
        if resp.status_code == 404:
            raise CliError(f"load {load_id} is unknown to {self.url} (did the engine restart?)", EXIT_UNREACHABLE)
        return self.checked(resp)


# ----- status ----------------------------------------------------------------------------

def _percent(progress: Any) -> str:
    return f"{float(progress) * 100:.0f}%"


def format_health(health: dict[str, Any], url: str) -> str:
    """One aligned block; absent facts show as ``-`` so the shape never changes."""
    stage = str(health.get("stage", "?"))
    if health.get("progress") is not None:
        stage += f" {_percent(health['progress'])}"
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
    engine = EngineClient(args.url or args.default_url, args.timeout)
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
        text = f"load {rec.get('id')} {rec.get('model')}: {rec.get('phase')} {_percent(progress)}"
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
    engine = EngineClient(url, args.timeout)
    try:
        resp = engine.request("POST", "/control/configure", payload)
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
    engine = EngineClient(args.url or args.default_url, args.timeout)
    try:
        config = engine.checked(engine.request("GET", "/control/config"))
    finally:
        engine.close()
    print(json.dumps(config, indent=2) if args.json else format_config(config))
    return EXIT_OK


# ----- entry point -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="seconds to wait for each HTTP answer (default 30)")
    url_help = f"engine URL (default ${URL_ENV} or {DEFAULT_URL})"
    ap = argparse.ArgumentParser(
        prog="hydractl", description="Look at and reconfigure a running Hydra engine (hydrad).",
        epilog="exit codes: 0 ok, 1 unreachable, 2 refused (4xx), 3 not serving, 4 model load failed",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    st = sub.add_parser("status", parents=[common], help="show the engine's stage, model and slots",
                        description="Show /health as a block. Exit 0 when serving, 3 when reachable but not "
                                    "serving (idle, loading, stopping), 1 when unreachable.")
    st.add_argument("url", nargs="?", metavar="URL", help=url_help)
    st.add_argument("--json", action="store_true", help="print the raw /health JSON")
    st.set_defaults(func=cmd_status)

    co = sub.add_parser(
        "configure", parents=[common], help="change runtime parameters (key=value ...)",
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

    cf = sub.add_parser("config", parents=[common], help="show effective parameters and where each came from",
                        description="Show /control/config as a table: name, value, source "
                                    "(default, model, yaml, runtime) and tier (T1 per request .. T3 reload).")
    cf.add_argument("url", nargs="?", metavar="URL", help=url_help)
    cf.add_argument("--json", action="store_true", help="print the raw /control/config JSON")
    cf.set_defaults(func=cmd_config)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.default_url = os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"hydractl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``hydractl``: look at and reconfigure one running engine from a shell.

The engine's HTTP plane already says everything; this tool spares operators hand-written
JSON and curl loops, and turns the answers into exit codes that scripts can branch on:

    0  done / serving
    1  the engine cannot be reached (or answered something that is not Hydra)
    2  the engine refused the request (a 4xx: bad field, unknown model, busy, forbidden)
    3  reachable but not serving (idle, loading, stopping)
    4  a model load failed

``info``, ``state`` and ``migrate`` speak Hydra's binary ops on the engine's merged RPC port
(``host:port``, docs/rpc-protocol.md) instead of HTTP, with the same exit codes: an error
frame from an engine exits 2, a port that cannot be reached (or does not speak the protocol) 1.

``engines``, ``profile`` and ``route`` ask the coordinator instead (``/admin/*``, default
``http://127.0.0.1:9000`` or ``$HYDRA_COORDINATOR_URL``), with the same exit codes; a profile
switch whose load fails exits 4. ``up`` runs a whole local pool (``hydrad/cli/up.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator, TextIO

import httpx
import xxhash
import yaml

from hydrad.cli.common import (
    COORDINATOR_URL, COORDINATOR_URL_ENV, EXIT_LOAD_FAILED, EXIT_NOT_SERVING, EXIT_OK, EXIT_REJECTED,
    EXIT_UNREACHABLE, CliError,
)
from hydrad.common import tokenfile
from hydrad.wire import protocol as P
from hydrad.wire.rpcclient import RpcClient, RpcError, migrate, parse_address

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "HYDRA_ENGINE_URL"
POLL_INTERVAL_S = 0.2
RPC_TOKEN_ENV = "HYDRA_RPC_TOKEN"  # the older name of TOKEN_ENV, still read
TOKEN_ENV = "HYDRA_TOKEN"  # the engines' token (rpc.token / rpc.token_file), for HTTP and the RPC port
TOKEN_FILE_ENV = "HYDRA_TOKEN_FILE"
STATE_READ_SIZE = 4 << 20

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

    what = "engine"  # named in every error, so the user knows which server is meant

    def __init__(self, url: str, timeout: float, token: str | None = None) -> None:
        self.url = normalize_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        if token:  # an engine with rpc.token wants it on /control/* and /slots/*/state*
            self._http.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return self._http.request(method, path, json=payload)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise CliError(f"cannot reach the {self.what} at {self.url} ({reason})", EXIT_UNREACHABLE) from None
        except httpx.InvalidURL as exc:
            raise CliError(f"bad {self.what} URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None

    def body(self, resp: httpx.Response) -> dict[str, Any]:
        """The JSON object of a response; anything else means this is not a Hydra server."""
        try:
            data = resp.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise CliError(f"{self.url}{resp.request.url.path} answered {resp.status_code} without a JSON object; "
                           f"is this a Hydra {self.what}?", EXIT_UNREACHABLE)
        return data

    def checked(self, resp: httpx.Response) -> dict[str, Any]:
        """The body of a successful response; an OpenAI error body becomes a CliError."""
        data = self.body(resp)
        if resp.is_success:
            return data
        err = data.get("error")
        self._check_error(resp, err)
        message = err.get("message") if isinstance(err, dict) else None
        message = message or f"HTTP {resp.status_code}"
        code = EXIT_REJECTED if resp.is_client_error else EXIT_UNREACHABLE
        raise CliError(f"{self.what} refused ({resp.status_code}): {message}", code)

    def _check_error(self, resp: httpx.Response, err: Any) -> None:
        """A hook for errors that mean "wrong kind of server" rather than "refused"."""

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


def engine_token(args: argparse.Namespace) -> str | None:
    """The engines' token: --token, else --token-file, else $HYDRA_TOKEN / $HYDRA_RPC_TOKEN, else the file
    $HYDRA_TOKEN_FILE names. A file keeps the secret out of the shell history and the process list."""
    token = getattr(args, "token", None)
    if token:
        return token
    path = getattr(args, "token_file", None)
    if not path:
        token = os.environ.get(TOKEN_ENV) or os.environ.get(RPC_TOKEN_ENV)
        if token:
            return token
        path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        return tokenfile.read_token(path)
    except tokenfile.TokenError as exc:
        raise CliError(f"--token-file: {exc}", EXIT_REJECTED) from None


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
    engine = EngineClient(url, args.timeout, engine_token(args))
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
    engine = EngineClient(args.url or args.default_url, args.timeout, engine_token(args))
    try:
        config = engine.checked(engine.request("GET", "/control/config"))
    finally:
        engine.close()
    print(json.dumps(config, indent=2) if args.json else format_config(config))
    return EXIT_OK


# ----- the merged RPC port ----------------------------------------------------------------

def rpc_address(text: str) -> str:
    """``host:port`` (``[v6]:port``, a ``tcp://`` prefix, a bare host for port 9503) as ``host:port``."""
    try:
        host, port = parse_address(text.strip())
    except ValueError:
        raise CliError(f"bad RPC address {text!r}: expected host:port", EXIT_UNREACHABLE) from None
    if not host or not 0 < port < 65536:
        raise CliError(f"bad RPC address {text!r}: expected host:port", EXIT_UNREACHABLE)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


@contextlib.contextmanager
def rpc_errors(address: str, refused: str | None = None) -> Iterator[None]:
    """Turn what the RPC client raises into CliErrors: an error frame exits 2, transport trouble 1.

    ``refused`` names the request in a refusal (default: the engine at ``address``). Local file
    problems must already be CliErrors by the time they get here, or they would read as
    network trouble.
    """
    try:
        yield
    except RpcError as exc:
        who = refused or f"the engine at {address}"
        raise CliError(f"{who} refused ({exc.code}): {exc.message}", EXIT_REJECTED) from None
    except P.ProtocolError as exc:
        raise CliError(f"{address} broke Hydra's RPC protocol ({exc.message}); is this an engine's RPC port?",
                       EXIT_UNREACHABLE) from None
    except TimeoutError:
        raise CliError(f"no answer from {address} in time; is this the engine's merged RPC port "
                       "(not its HTTP port)?", EXIT_UNREACHABLE) from None
    except OSError as exc:  # refused, reset, closed, unknown host
        raise CliError(f"cannot reach the engine's RPC port at {address} ({_reason(exc)})", EXIT_UNREACHABLE) from None


def connect(address: str, args: argparse.Namespace) -> RpcClient:
    """A client that has said HELLO (with the token, when one is given)."""
    return RpcClient(address, token=engine_token(args), timeout=args.rpc_timeout)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _gib(n: Any) -> str:
    return f"{int(n) / (1 << 30):.1f} GiB" if isinstance(n, int) else "?"


def _throughput(n_bytes: int, seconds: float) -> str:
    return f"{n_bytes / 1e6 / seconds:.0f} MB/s" if seconds > 0 else "- MB/s"


# ----- info ------------------------------------------------------------------------------

def format_info(info: dict[str, Any], address: str) -> str:
    """INFO as one aligned block: engine, stage, model identity, one line per slot and device."""
    stage = str(info.get("stage", "?"))
    if info.get("progress") is not None and stage != "ready":
        stage += f" {_percent(info['progress'])}"
    model = info.get("model") or {}
    rows: list[tuple[str, Any]] = [
        ("engine", f"{info.get('engine', '-')}  ({address})"),
        ("version", info.get("version") or "-"),
        ("stage", stage),
        ("model", model.get("id") or "-"),
    ]
    if model:
        rows += [
            ("arch", f"{model.get('arch', '-')}, {model.get('n_layer', '?')} layers, "
                     f"n_embd {model.get('n_embd', '?')}, n_head_kv {model.get('n_head_kv', '?')}"),
            ("desc", model.get("desc") or "-"),
            ("fingerprint", model.get("fingerprint") or "-"),
        ]
    rows.append(("generation", info.get("generation") or "-"))
    slots = info.get("slots") or []
    busy = sum(1 for s in slots if s.get("busy"))
    rows.append(("slots", f"{busy}/{len(slots)} busy, {sum(int(s.get('n_tokens') or 0) for s in slots)} tokens cached"))
    for s in slots:
        rows.append((f"  slot {s.get('id')}", f"{'busy' if s.get('busy') else 'idle'}  {s.get('n_tokens', 0)} tokens"))
    devices = (info.get("rpc") or {}).get("ggml_rpc_devices") or []
    if not devices:
        rows.append(("devices", "- (no ggml-RPC server)"))
    for i, d in enumerate(devices):
        rows.append(("devices" if i == 0 else "", f"{d.get('name', '?')}  {d.get('description') or '-'}  "
                     f"({d.get('type', '?')}, {_gib(d.get('memory_free'))} free of {_gib(d.get('memory_total'))})"))
    if info.get("last_error"):
        rows.append(("last_error", info["last_error"]))
    return "\n".join(f"{name:<11} {value}".rstrip() for name, value in rows)


def cmd_info(args: argparse.Namespace) -> int:
    address = rpc_address(args.address)
    with rpc_errors(address):
        with connect(address, args) as client:
            info = client.info()
    print(json.dumps(info, indent=2) if args.json else format_info(info, address))
    return EXIT_OK


# ----- state get / put / meta ------------------------------------------------------------

def _error_of(frame: P.Frame) -> RpcError | None:
    if frame.code < P.Status.ERROR:
        return None
    try:
        body = frame.json()
    except P.ProtocolError:
        body = {}
    return RpcError(frame.code, str(body.get("code", "error")), str(body.get("message", "error")))


def _write(fh: BinaryIO, data: bytes, path: Path) -> None:
    try:
        fh.write(data)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {_reason(exc)}", EXIT_REJECTED) from None


def receive_state(client: RpcClient, slot: int, fh: BinaryIO, path: Path) -> dict[str, Any]:
    """STATE_GET ``slot`` and write every frame of the answer to ``fh`` byte for byte.

    The frames are written as they arrive (code, length, payload: the canonical encoding, so the
    file is exactly the stream received). The data is checked against STATE_END before returning,
    so a file is only ever kept when it is complete. Returns the meta.
    """
    client.send(P.encode_json(P.Op.STATE_GET, {"slot": slot}))
    first = client.recv()
    err = _error_of(first)
    if err is not None:
        raise err
    if first.code != P.Status.STATE_META:
        raise P.ProtocolError(f"expected STATE_META, got 0x{first.code:02x}")
    meta = first.json()
    _write(fh, P.encode(first.code, first.payload), path)
    digest, total = xxhash.xxh3_128(), 0
    while True:
        frame = client.recv()
        err = _error_of(frame)
        if err is not None:
            raise err
        if frame.code not in (P.Status.STATE_DATA, P.Status.STATE_END):
            raise P.ProtocolError(f"unexpected frame 0x{frame.code:02x} in a state stream")
        _write(fh, P.HEADER.pack(frame.code, len(frame.payload)), path)
        _write(fh, frame.payload, path)
        if frame.code == P.Status.STATE_END:
            end = frame.json()
            break
        digest.update(frame.payload)
        total += len(frame.payload)
    if not total == meta.get("bytes") == end.get("bytes"):
        raise P.ProtocolError(f"state stream carried {total} bytes; meta says {meta.get('bytes')}, "
                              f"STATE_END {end.get('bytes')}")
    if end.get("xxh3_128") not in (None, digest.hexdigest()):
        raise P.ProtocolError("xxh3_128 of the state data does not match STATE_END")
    return meta


def cmd_state_get(args: argparse.Namespace) -> int:
    address = rpc_address(args.address)
    out = Path(args.output)
    try:  # next to the target, so the final rename is atomic; mode 0600: a KV state holds a conversation
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {_reason(exc)}", EXIT_REJECTED) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            t0 = time.monotonic()
            with rpc_errors(address), connect(address, args) as client:
                meta = receive_state(client, args.slot, fh, out)
            seconds = time.monotonic() - t0
            try:
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as exc:
                raise CliError(f"cannot write {out}: {_reason(exc)}", EXIT_REJECTED) from None
        try:
            os.replace(tmp, out)
        except OSError as exc:
            raise CliError(f"cannot write {out}: {_reason(exc)}", EXIT_REJECTED) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    n_bytes = int(meta["bytes"])
    print(f"saved slot {args.slot} of {address} to {out}: {meta.get('n_tokens')} tokens, {n_bytes} bytes "
          f"({_mb(n_bytes)}) in {seconds:.3f}s ({_throughput(n_bytes, seconds)})")
    return EXIT_OK


class StateFile:
    """Frames of a saved state stream (STATE_META, STATE_DATA…, STATE_END, response codes), read lazily.

    ``chunks()`` checks the data against the file's own STATE_END before its last chunk is let go,
    so a damaged file aborts the upload (the engine then drops it and keeps the slot) rather than
    landing in a slot.
    """

    def __init__(self, fh: BinaryIO, path: Path) -> None:
        self.fh = fh
        self.path = path
        self.decoder = P.FrameDecoder(P.RESPONSE_CODES)
        self.pending: list[P.Frame] = []

    def _bad(self, why: str) -> CliError:
        return CliError(f"{self.path} is not a valid state stream: {why}", EXIT_REJECTED)

    def next(self) -> P.Frame:
        try:
            while not self.pending:
                data = self.fh.read(STATE_READ_SIZE)
                if not data:
                    self.decoder.eof()
                    raise self._bad("it ends before STATE_END")
                self.pending.extend(self.decoder.feed(data))
        except P.ProtocolError as exc:
            raise self._bad(exc.message) from None
        except OSError as exc:
            raise CliError(f"cannot read {self.path}: {_reason(exc)}", EXIT_REJECTED) from None
        return self.pending.pop(0)

    def meta(self) -> dict[str, Any]:
        frame = self.next()
        if frame.code != P.Status.STATE_META:
            raise self._bad(f"it starts with frame 0x{frame.code:02x}, not STATE_META (0x01)")
        try:
            meta = frame.json()
        except P.ProtocolError as exc:
            raise self._bad(exc.message) from None
        if not isinstance(meta.get("bytes"), int):
            raise self._bad("its meta has no byte count")
        self.declared = int(meta["bytes"])
        return meta

    def chunks(self) -> Iterator[bytes]:
        digest, total = xxhash.xxh3_128(), 0
        held: bytes | None = None  # one chunk behind, so the last one goes only after STATE_END checked out
        while True:
            frame = self.next()
            if frame.code == P.Status.STATE_DATA:
                if held is not None:
                    yield held
                held = frame.payload
                digest.update(held)
                total += len(held)
            elif frame.code == P.Status.STATE_END:
                break
            else:
                raise self._bad(f"unexpected frame 0x{frame.code:02x} inside the stream")
        try:
            end = frame.json()
        except P.ProtocolError as exc:
            raise self._bad(exc.message) from None
        if not total == self.declared == end.get("bytes"):
            raise self._bad(f"it holds {total} data bytes; meta says {self.declared}, STATE_END {end.get('bytes')}")
        if end.get("xxh3_128") not in (None, digest.hexdigest()):
            raise self._bad("xxh3_128 of its data does not match its STATE_END")
        if held is not None:
            yield held


def cmd_state_put(args: argparse.Namespace) -> int:
    address = rpc_address(args.address)
    path = Path(args.input)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {_reason(exc)}", EXIT_REJECTED) from None
    with fh:
        state = StateFile(fh, path)
        meta = state.meta()
        t0 = time.monotonic()
        with rpc_errors(address), connect(address, args) as client:
            result = client.state_put(args.slot, meta, state.chunks())
        seconds = time.monotonic() - t0
    n_bytes = int(meta["bytes"])
    print(f"restored slot {result.get('slot', args.slot)} of {address} from {path}: {result.get('n_tokens')} tokens, "
          f"{n_bytes} bytes ({_mb(n_bytes)}) in {seconds:.3f}s ({_throughput(n_bytes, seconds)})")
    return EXIT_OK


def format_state_meta(meta: dict[str, Any]) -> str:
    model = meta.get("model") or {}
    tokens = meta.get("tokens") or []
    head = ", ".join(str(t) for t in tokens[:8]) + (", ..." if len(tokens) > 8 else "")
    n_bytes = meta.get("bytes")
    rows: list[tuple[str, Any]] = [
        ("format", meta.get("format") or "-"),
        ("model", f"{meta.get('model_id') or '-'}  ({model.get('arch', '-')}, {model.get('desc') or '-'})"),
        ("fingerprint", model.get("fingerprint") or "-"),
        ("cache", f"K {meta.get('cache_type_k', '-')}, V {meta.get('cache_type_v', '-')}"),
        ("n_ctx", meta.get("n_ctx", "-")),
        ("n_tokens", meta.get("n_tokens", "-")),
        ("bytes", f"{n_bytes} ({_mb(n_bytes)})" if isinstance(n_bytes, int) else "-"),
        ("tokens", f"[{head}]"),
    ]
    return "\n".join(f"{name:<11} {value}" for name, value in rows)


def cmd_state_meta(args: argparse.Namespace) -> int:
    address = rpc_address(args.address)
    with rpc_errors(address), connect(address, args) as client:
        # Only the first frame is read; closing drops the data, which the engine takes quietly.
        meta = client.state_get(args.slot).meta
    print(json.dumps(meta, indent=2) if args.json else format_state_meta(meta))
    return EXIT_OK


# ----- migrate ---------------------------------------------------------------------------

def cmd_migrate(args: argparse.Namespace) -> int:
    src, dst = rpc_address(args.source), rpc_address(args.destination)
    to_slot = args.slot if args.to_slot is None else args.to_slot
    for address in (src, dst):  # say which side is down before the migration can only say "one of them"
        with rpc_errors(address), connect(address, args):
            pass
    what = f"migration of slot {args.slot} of {src} to slot {to_slot} of {dst}"
    t0 = time.monotonic()
    with rpc_errors(f"{src} or {dst}", refused=what):
        result = migrate(src, dst, args.slot, dst_slot=to_slot, token=engine_token(args))
    seconds = float(result.get("total_seconds") or time.monotonic() - t0)
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    n_bytes = int(result.get("bytes") or 0)
    restore = result.get("seconds")
    tail = f"; restore took {float(restore):.3f}s" if restore is not None else ""
    print(f"migrated slot {args.slot} of {src} to slot {result.get('slot', to_slot)} of {dst}: "
          f"{result.get('n_tokens')} tokens, {n_bytes} bytes ({_mb(n_bytes)}) in {seconds:.3f}s "
          f"({_throughput(n_bytes, seconds)}){tail}")
    return EXIT_OK


# ----- the coordinator: engines, profile, route -------------------------------------------

class CoordinatorClient(EngineClient):
    """EngineClient's calls against the coordinator, with errors that say "coordinator"."""

    what = "coordinator"

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(url, timeout)
        # /admin/* may need the admin token: $HYDRA_ADMIN_TOKEN, or the file $HYDRA_ADMIN_TOKEN_FILE names.
        try:
            self._http.headers.update(tokenfile.bearer(tokenfile.admin_token_from_env()))
        except tokenfile.TokenError as exc:
            raise CliError(f"{tokenfile.ENV_ADMIN_TOKEN_FILE}: {exc}", EXIT_REJECTED) from None

    def _check_error(self, resp: httpx.Response, err: Any) -> None:
        if resp.status_code == 404 and isinstance(err, dict) and err.get("code") == "not_found":
            raise CliError(f"{self.url} has no {resp.request.url.path}; is this a Hydra coordinator "
                           "(not an engine)?", EXIT_UNREACHABLE)
        if resp.status_code in (401, 403) and isinstance(err, dict):
            hint = (f"set {tokenfile.ENV_ADMIN_TOKEN_FILE} to the coordinator's admin token file"
                    if resp.status_code == 401 else "run it from an address in the coordinator's admin_allow_from")
            raise CliError(f"{self.url}: {err.get('message')}; {hint}", EXIT_UNREACHABLE)

    def get(self, path: str) -> dict[str, Any]:
        return self.checked(self.request("GET", path))


def _coordinator(args: argparse.Namespace) -> CoordinatorClient:
    return CoordinatorClient(args.url or args.default_coordinator_url, args.timeout)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(r)).rstrip() for r in rows]


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def _tps(value: Any) -> str:
    return f"{float(value):.1f}" if isinstance(value, (int, float)) and value > 0 else "-"


def _stage(e: dict[str, Any]) -> str:
    stage = str(e.get("stage") or "?")
    if e.get("progress") is not None and stage not in ("ready", "idle"):
        stage += f" {_percent(e['progress'])}"
    return stage


def _serving(e: dict[str, Any]) -> str:
    """The model served, and the one on its way in when a load is under way."""
    model, loading = e.get("model"), e.get("loading_model")
    if loading and loading != model:
        return f"{model or '-'} -> {loading}"
    return model or "-"


# ----- engines ---------------------------------------------------------------------------

def format_engines(data: dict[str, Any], url: str) -> str:
    engines = data.get("engines") or []
    alive = sum(1 for e in engines if e.get("alive"))
    lines = [f"coordinator {url}, profile {data.get('profile') or '-'}, {alive}/{len(engines)} engines alive"]
    if not engines:
        return "\n".join(lines + ["no engine has registered"])
    # "device": the GPU(s) the engine is bound to (its `device` setting), "all" when it sees every GPU
    rows: list[tuple[str, ...]] = [("engine", "alive", "device", "stage", "model", "slots", "queue", "decode tok/s",
                                    "heartbeat")]
    notes: list[str] = []
    for e in engines:
        total = int(e.get("slots_total") or 0)
        slots = f"{e.get('slots_busy', 0)}/{total}" if total else "-"
        age = e.get("last_seen_s")
        rows.append((str(e.get("name")), _yes(e.get("alive")), str(e.get("device") or "all"), _stage(e), _serving(e),
                     slots, f"{e.get('queued', 0)}/{e.get('max_queue', '-')}", _tps(e.get("decode_tps")),
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
    return "\n".join(lines + _table(rows) + notes)


def cmd_engines(args: argparse.Namespace) -> int:
    coord = _coordinator(args)
    try:
        data = coord.get("/admin/engines")
    finally:
        coord.close()
    print(json.dumps(data, indent=2) if args.json else format_engines(data, coord.url))
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
            matches = _yes(t.get("matches")) + (f", configuring ({t['configuring']})" if t.get("configuring") else "")
            rows.append((name, _yes(t.get("alive")), target, t.get("model") or "-", t.get("stage") or "-", matches))
        lines += _table(rows)
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
                text = f"{name}: {p.get('stage') or '?'} {p.get('model') or ''} {_percent(frac or 0.0)}"
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
        before = coord.get("/admin/profile")
        if not rest:
            print(json.dumps(before, indent=2) if args.json else format_profile(before))
            return EXIT_OK
        name = rest[0]
        previous = (before.get("last_switch") or {}).get("started")
        resp = coord.request("POST", "/admin/profile", {"name": name, "wait": False})
        coord.checked(resp)
        print(f"switching to {name} (from {before.get('active') or '-'})", flush=True)
        progress = SwitchProgress(sys.stderr)
        try:
            while True:
                data = coord.get("/admin/profile")
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
        table: list[tuple[str, ...]] = [("engine", "cost s", "wait s", "load s", "prefill s", "warm")]
        for c in candidates:
            table.append((str(c.get("engine")), *(f"{float(c.get(k) or 0.0):.4f}"
                                                  for k in ("cost_s", "wait_s", "load_s", "prefill_s")),
                          _yes(c.get("warm"))))
        lines += ["  " + line for line in _table(table)]
    rejected = d.get("rejected") or {}
    lines.append(f"rejected ({len(rejected)}):")
    width = max((len(n) for n in rejected), default=0)
    lines += [f"  {n:<{width}}  {why}" for n, why in rejected.items()]
    if d.get("engine") is None and d.get("loading"):
        lines.append(f"a request now would wait for {', '.join(d['loading'])}, which is loading {d.get('model')}")
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
        decision = coord.checked(coord.request("POST", "/admin/route", body))
    finally:
        coord.close()
    if args.json:
        print(json.dumps(decision, indent=2))
    elif args.explain:
        print(format_route(decision))
    else:
        print(decision.get("engine") or f"none: {decision.get('reason')}")
    return EXIT_OK if decision.get("engine") else EXIT_NOT_SERVING


# ----- up --------------------------------------------------------------------------------

def cmd_up(args: argparse.Namespace) -> int:
    from hydrad.cli import up  # the local-cluster runner; only this command needs it

    return up.run(args)


# ----- entry point -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="seconds to wait for each HTTP answer (default 30)")
    url_help = f"engine URL (default ${URL_ENV} or {DEFAULT_URL})"
    ap = argparse.ArgumentParser(
        prog="hydractl", description="Look at and reconfigure a running Hydra engine (hydrad).",
        epilog="exit codes: 0 ok, 1 unreachable, 2 refused (4xx or an RPC error frame), 3 not serving, "
               "4 model load failed",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rpc_auth = argparse.ArgumentParser(add_help=False)
    rpc_auth.add_argument("--token", metavar="T",
                          help=f"the engines' token, rpc.token (default ${TOKEN_ENV}; prefer --token-file)")
    rpc_auth.add_argument("--token-file", metavar="FILE",
                          help=f"read the engines' token from FILE (default ${TOKEN_FILE_ENV}), e.g. /etc/hydra/engine.token")
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

    rpc_common = argparse.ArgumentParser(add_help=False, parents=[rpc_auth])
    rpc_common.add_argument("--timeout", dest="rpc_timeout", type=float, default=60.0, metavar="S",
                            help="seconds to wait for each answer on the RPC port (default 60)")
    addr_help = "the engine's merged RPC port, host:port"

    inf = sub.add_parser("info", parents=[rpc_common], help="INFO over the merged RPC port",
                         description="Show the engine's INFO (RPC op 0x41): stage, model identity and fingerprint, "
                                     "slots with their cached tokens, ggml-RPC devices.")
    inf.add_argument("address", metavar="RPC_ADDR", help=addr_help)
    inf.add_argument("--json", action="store_true", help="print the raw INFO JSON")
    inf.set_defaults(func=cmd_info)

    sta = sub.add_parser("state", help="save, restore or inspect a slot's KV state",
                         description="A slot's KV cache over the merged RPC port. A state file holds the frames "
                                     "of a STATE_GET answer exactly as received (the body of GET /slots/{id}/state "
                                     "too), so PUT /slots/{id}/state takes it as well.")
    state_sub = sta.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    sg = state_sub.add_parser("get", parents=[rpc_common], help="save a slot's KV state to a file",
                              description="STATE_GET a slot and write the stream to FILE (via a temporary file "
                                          "and a rename, checked against STATE_END first).")
    sg.add_argument("address", metavar="RPC_ADDR", help=addr_help)
    sg.add_argument("--slot", type=int, required=True, metavar="S", help="slot to read")
    sg.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the state stream")
    sg.set_defaults(func=cmd_state_get)
    sp = state_sub.add_parser("put", parents=[rpc_common], help="restore a slot from a state file",
                              description="STATE_PUT a state file into a slot; the engine checks the model and "
                                          "cache layout before any data is sent, and the slot keeps its old "
                                          "contents on any error.")
    sp.add_argument("address", metavar="RPC_ADDR", help=addr_help)
    sp.add_argument("--slot", type=int, required=True, metavar="S", help="slot to restore")
    sp.add_argument("-i", "--input", required=True, metavar="FILE", help="a file written by 'hydractl state get'")
    sp.set_defaults(func=cmd_state_put)
    sm = state_sub.add_parser("meta", parents=[rpc_common], help="show a slot's state meta",
                              description="Show the meta of a slot's state (model identity, cache types, tokens, "
                                          "bytes) without transferring the data.")
    sm.add_argument("address", metavar="RPC_ADDR", help=addr_help)
    sm.add_argument("--slot", type=int, required=True, metavar="S", help="slot to inspect")
    sm.add_argument("--json", action="store_true", help="print the whole meta, token list included")
    sm.set_defaults(func=cmd_state_meta)

    mi = sub.add_parser("migrate", parents=[rpc_auth], help="move a slot's KV state from engine A to engine B",
                        description="Stream a slot's KV state from engine A straight into engine B\n"
                                    "(STATE_GET -> STATE_PUT, no disk). A request with id_slot set to the\n"
                                    "target slot then continues on B without prefilling the prompt again.",
                        epilog="example:\n  hydractl migrate --slot 0 --to-slot 2 gpu0:9503 gpu1:9503",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    mi.add_argument("--slot", type=int, required=True, metavar="S", help="slot on A")
    mi.add_argument("--to-slot", type=int, metavar="T", help="slot on B (default: S)")
    mi.add_argument("source", metavar="A", help="source engine's RPC port, host:port")
    mi.add_argument("destination", metavar="B", help="destination engine's RPC port, host:port")
    mi.add_argument("--json", action="store_true", help="print the result as JSON")
    mi.set_defaults(func=cmd_migrate, rpc_timeout=60.0)

    coord_help = f"coordinator URL (default ${COORDINATOR_URL_ENV} or {COORDINATOR_URL})"
    en = sub.add_parser("engines", parents=[common], help="the coordinator's engines as a table",
                        description="Show GET /admin/engines of the coordinator: every engine with alive, stage, "
                                    "model, slots busy/total, queue, measured decode tok/s and the age of its last "
                                    "heartbeat. Exit 0 when some engine is alive, 3 when none is.")
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
                                    "--explain adds the step, the reason, every candidate's cost and every\n"
                                    "rejected engine with why. Exit 0 when an engine was chosen, 3 when none.",
                        epilog="example:\n  hydractl route --explain --model smollm2-135m --session s1 'Hello there'",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ro.add_argument("args", nargs="*", metavar="[URL] PROMPT", help=f"the prompt, after an optional {coord_help}")
    ro.add_argument("--explain", action="store_true", help="show step, reason, candidates and rejections")
    ro.add_argument("--model", metavar="M", help="model to route for (default: the pool's default model)")
    ro.add_argument("--session", metavar="S", help="session id (session affinity)")
    ro.add_argument("--max-tokens", type=int, metavar="N", help="max_tokens of the request (default 256)")
    ro.add_argument("--completion", action="store_true", help="route a completion (prompt) instead of a chat turn")
    ro.add_argument("--json", action="store_true", help="print the raw decision JSON")
    ro.set_defaults(func=cmd_route, intermixed=True)

    up = sub.add_parser("up", help="run a local pool: the coordinator and its engines as subprocesses",
                        description="Start hydra-coordinator and the engines its profiles name (<config-dir>/<engine>.yaml)\n"
                                    "as local processes, without systemd; wait until every engine is alive and the\n"
                                    "profile is applied, print the OpenAI endpoint, and run until Ctrl-C or SIGTERM,\n"
                                    "which stop every process (SIGTERM, then SIGKILL after --stop-timeout).\n"
                                    "Exit 0 after a requested stop, 1 when start-up fails (a process died, a port is\n"
                                    "taken, time ran out), 2 for a bad config, 130 when interrupted during start-up.",
                        epilog="examples:\n  hydractl up\n  hydractl up --profile swapped --logs ~/hydra-logs\n"
                               "  hydractl up --port-offset 1000      # every port of the configs + 1000",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--config-dir", metavar="DIR", default=None,
                    help="coordinator.yaml, profiles and one <engine>.yaml per engine (default etc/hydra/dev)")
    up.add_argument("--profile", metavar="NAME", help="profile to apply at start (default: the coordinator's)")
    up.add_argument("--logs", metavar="DIR", help="write each process's log to DIR/<name>.log instead of the terminal")
    up.add_argument("--port-offset", type=int, default=0, metavar="N",
                    help="add N to every port of the configs (run beside another pool)")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds start-up may take, models loaded (default 300)")
    up.add_argument("--stop-timeout", type=float, default=20.0, metavar="S",
                    help="seconds to wait after SIGTERM before SIGKILL (default 20)")
    up.set_defaults(func=cmd_up)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra:  # words after an option: only commands taking free text (route's PROMPT) accept them
        if not getattr(args, "intermixed", False) or any(x.startswith("-") for x in extra):
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = list(args.args) + extra
    args.default_url = os.environ.get(URL_ENV) or DEFAULT_URL
    args.default_coordinator_url = os.environ.get(COORDINATOR_URL_ENV) or COORDINATOR_URL
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"hydractl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

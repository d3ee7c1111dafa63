"""``hydractl info``, ``state get|put|meta`` and ``migrate``: Hydra's binary ops on an engine's
merged RPC port (``host:port``, docs/rpc-protocol.md). An error frame from an engine exits 2, a
port that cannot be reached (or does not speak the protocol) 1."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import xxhash

from hydrad.cli.common import EXIT_OK, EXIT_REJECTED, CliError
from hydrad.cli.ctl.clients import connect, engine_token, reason, rpc_address, rpc_errors
from hydrad.cli.ctl.text import gib, mb, percent, throughput
from hydrad.wire import protocol as P
from hydrad.wire.rpcclient import RpcClient, RpcError, migrate

STATE_READ_SIZE = 4 << 20


# ----- info ------------------------------------------------------------------------------

def format_info(info: dict[str, Any], address: str) -> str:
    """INFO as one aligned block: engine, stage, model identity, one line per slot and device."""
    stage = str(info.get("stage", "?"))
    if info.get("progress") is not None and stage != "ready":
        stage += f" {percent(info['progress'])}"
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
                     f"({d.get('type', '?')}, {gib(d.get('memory_free'))} free of {gib(d.get('memory_total'))})"))
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
        raise CliError(f"cannot write {path}: {reason(exc)}", EXIT_REJECTED) from None


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
        raise CliError(f"cannot write {out}: {reason(exc)}", EXIT_REJECTED) from None
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
                raise CliError(f"cannot write {out}: {reason(exc)}", EXIT_REJECTED) from None
        try:
            os.replace(tmp, out)
        except OSError as exc:
            raise CliError(f"cannot write {out}: {reason(exc)}", EXIT_REJECTED) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    n_bytes = int(meta["bytes"])
    print(f"saved slot {args.slot} of {address} to {out}: {meta.get('n_tokens')} tokens, {n_bytes} bytes "
          f"({mb(n_bytes)}) in {seconds:.3f}s ({throughput(n_bytes, seconds)})")
    return EXIT_OK


class KvStreamFile:
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
            raise CliError(f"cannot read {self.path}: {reason(exc)}", EXIT_REJECTED) from None
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
        raise CliError(f"cannot read {path}: {reason(exc)}", EXIT_REJECTED) from None
    with fh:
        stream = KvStreamFile(fh, path)
        meta = stream.meta()
        t0 = time.monotonic()
        with rpc_errors(address), connect(address, args) as client:
            result = client.state_put(args.slot, meta, stream.chunks())
        seconds = time.monotonic() - t0
    n_bytes = int(meta["bytes"])
    print(f"restored slot {result.get('slot', args.slot)} of {address} from {path}: {result.get('n_tokens')} tokens, "
          f"{n_bytes} bytes ({mb(n_bytes)}) in {seconds:.3f}s ({throughput(n_bytes, seconds)})")
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
        ("bytes", f"{n_bytes} ({mb(n_bytes)})" if isinstance(n_bytes, int) else "-"),
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

def cmd_migrate_session(args: argparse.Namespace) -> int:
    """``hydractl migrate SESSION ENGINE``: the coordinator moves the session's KV (POST /admin/sessions/move)."""
    from hydrad.cli.ctl.clients import CoordinatorClient

    coord = CoordinatorClient(args.url or args.default_coordinator_url, args.rpc_timeout)
    try:
        result = coord.move_session(args.source, args.destination)
    finally:
        coord.close()
    if args.json:
        print(json.dumps(result, indent=2))
    elif not result.get("moved"):
        print(f"session {args.source} is on {args.destination} already")
    else:
        where = "from its engine" if result.get("from") == "engine" else "from the Store"
        print(f"moved session {args.source} to {args.destination} {where}: slot {result.get('slot')}, "
              f"{result.get('n_tokens')} tokens in {float(result.get('seconds') or 0):.3f}s")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.slot is None:
        return cmd_migrate_session(args)
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
          f"{result.get('n_tokens')} tokens, {n_bytes} bytes ({mb(n_bytes)}) in {seconds:.3f}s "
          f"({throughput(n_bytes, seconds)}){tail}")
    return EXIT_OK


# ----- the command line -------------------------------------------------------------------

def add_parsers(sub: Any, common: argparse.ArgumentParser, rpc_auth: argparse.ArgumentParser) -> None:
    """info, state get|put|meta and migrate; ``rpc_auth`` adds the engines' token."""
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

    mi = sub.add_parser("migrate", parents=[rpc_auth], help="move a session to an engine, or a slot from engine A to B",
                        description="SESSION ENGINE: ask the coordinator to move a session's KV to ENGINE now\n"
                                    "(engine to engine over the merged ports, else from the Store); its next turn\n"
                                    "goes there without prefilling the conversation again.\n"
                                    "--slot S A B: stream slot S of engine A straight into engine B\n"
                                    "(STATE_GET -> STATE_PUT, no disk). A request with id_slot set to the\n"
                                    "target slot then continues on B without prefilling the prompt again.",
                        epilog="examples:\n  hydractl migrate s-42 gpu1\n"
                               "  hydractl migrate --slot 0 --to-slot 2 gpu0:9503 gpu1:9503",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    mi.add_argument("--slot", type=int, metavar="S", help="slot on A (slot mode; without it: SESSION ENGINE)")
    mi.add_argument("--to-slot", type=int, metavar="T", help="slot on B (default: S)")
    mi.add_argument("--url", metavar="URL", help="coordinator URL for SESSION ENGINE (default $HYDRA_COORDINATOR_URL "
                                                  "or the local one)")
    mi.add_argument("source", metavar="A|SESSION", help="source engine's RPC port host:port, or a session id")
    mi.add_argument("destination", metavar="B|ENGINE", help="destination engine's RPC port host:port, or an engine name")
    mi.add_argument("--json", action="store_true", help="print the result as JSON")
    mi.set_defaults(func=cmd_migrate, rpc_timeout=60.0)

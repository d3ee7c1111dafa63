"""``hydractl store stats|ls|verify|gc``: a KV store directory (hydrad/store, docs/store.md), opened
directly. Exit 0 when done (verify: when every chunk is good), 2 when verify finds damage or the
directory cannot be used as a store."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path
from typing import Any

from hydrad.cli.common import EXIT_OK, EXIT_REJECTED, CliError
from hydrad.store import Store, StoreError
from hydrad.store.settings import DEFAULT_POOL, POOL_PATTERN, default_dir


def _open(args: argparse.Namespace) -> Store:
    path = Path(args.dir) if args.dir else default_dir(args.pool)
    if not (path / "manifests").is_dir():
        raise CliError(f"no store at {path} (no manifests/ directory)", EXIT_REJECTED)
    try:
        return Store(dir=path)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_REJECTED) from exc


def _pool(name: str) -> str:
    if not re.match(POOL_PATTERN, name):
        raise argparse.ArgumentTypeError(f"{name!r}: 1 to 64 of A-Z a-z 0-9 _ . -")
    return name


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def cmd_stats(args: argparse.Namespace) -> int:
    st = _open(args).stats()
    rows = [("dir", st["dir"]), ("objects", f"{st['objects']} ({st['blob_objects']} stored as plain blobs)"),
            ("chunks", f"{st['chunks']}, {_mb(st['chunk_bytes'])} on disk"),
            ("logical", f"{_mb(st['logical_bytes'])} (dedup {st['dedup_ratio']:.2f}x)"),
            ("cap", f"{_mb(st['used_bytes'])} used of {_mb(st['cap_bytes'])}"),
            ("block", f"{st['block_tokens']} tokens"),
            ("garbage", f"{st['unreferenced_chunks']} unreferenced chunks, {st['tmp_files']} tmp files, "
                        f"{st['bad_manifests']} unreadable manifests")]
    _emit(args, st, "\n".join(f"{k:<9} {v}" for k, v in rows))
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    objs = _open(args).ls()
    lines = [f"{'KEY':<32}  {'MODEL':<10} {'TOKENS':>7} {'BYTES':>11} {'CHUNKS':>6}  LAYOUT  LAST USED"]
    for o in objs:
        used = datetime.datetime.fromtimestamp(o["last_used"]).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"{o['key']:<32}  {str(o['model_id'] or o['model'] or '-'):<10} {o['n_tokens']:>7} "
                     f"{o['bytes']:>11} {o['chunks']:>6}  {o['layout']:<6}  {used}")
    if not objs:
        lines.append("(no objects)")
    _emit(args, objs, "\n".join(lines))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    rep = _open(args).verify()
    lines = [f"{rep['objects']} objects, {rep['chunks']} chunks: " + ("all good" if rep["ok"] else "DAMAGED")]
    for b in rep["bad_chunks"]:
        lines.append(f"  chunk {b['chunk']} {b['why']}; used by {', '.join(b['objects']) or 'no object'}")
    for name, why in rep["bad_manifests"].items():
        lines.append(f"  manifest {name}: {why}")
    if rep["unreferenced_chunks"] or rep["tmp_files"]:
        lines.append(f"  {rep['unreferenced_chunks']} unreferenced chunks, {rep['tmp_files']} tmp files (gc removes them)")
    _emit(args, rep, "\n".join(lines))
    return EXIT_OK if rep["ok"] else EXIT_REJECTED


def cmd_gc(args: argparse.Namespace) -> int:
    res = _open(args).gc()
    _emit(args, res, f"removed {res['removed_chunks']} unreferenced chunks ({_mb(res['removed_bytes'])}), "
                     f"{res['removed_tmp']} tmp files; evicted {res['evicted_objects']} objects over the cap")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    st = sub.add_parser("store", help="inspect or clean a KV store directory",
                        description="The Hydra KV store (docs/store.md), read from its directory directly.")
    ssub = st.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    for name, func, help_ in (("stats", cmd_stats, "objects, chunks, bytes, dedup ratio, cap"),
                              ("ls", cmd_ls, "objects, most recently used first"),
                              ("verify", cmd_verify, "recompute every chunk's hash (exit 2 on damage)"),
                              ("gc", cmd_gc, "remove unreferenced chunks and stray tmp files, enforce the cap")):
        p = ssub.add_parser(name, help=help_, description=help_)
        p.add_argument("--dir", metavar="DIR", help="the store directory (default: the pool's, "
                                                   f"{default_dir('POOL')})")
        p.add_argument("--pool", metavar="POOL", default=DEFAULT_POOL, type=_pool,
                       help=f"the pool whose store to open when --dir is not given: its coordinator's pool setting, by "
                            f"default bus-<port of its bus> (default {DEFAULT_POOL})")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=func)

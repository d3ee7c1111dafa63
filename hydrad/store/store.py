"""The store proper: objects (a KV state of a token prefix under a model identity) as manifests over
content-addressed chunks, with reference counts, GC, an LRU size cap and longest-prefix lookup.

Directory layout (docs/store.md)::

    <dir>/.lock                     flock: shared for reads, exclusive for put/delete/gc/evict
    <dir>/chunks/ab/abcdef…         chunk bytes, named by their xxh3-128
    <dir>/manifests/<key>.json      one per object; its mtime is the object's last use (LRU)
    <dir>/tmp/                      files being written; anything left here is from a killed writer

Reference counts are derived from the manifests, never stored: reopening (or any mutating call, which
rescans under the exclusive lock) recomputes them, so a crash cannot leave a count wrong.

Each object names its **owner** (the tenant whose namespace made it, hydrad.common.tenants.store_owner;
"" for the shared one). A put with a ``quota`` evicts that owner's own least recently used objects
until the owner holds at most the quota; the store's cap still evicts by age across owners. So a key
that fills the store with its prompts ages out its own objects, not its neighbours'.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import xxhash

from hydrad.store import layout as L, privatedir
from hydrad.store.errors import StoreError
from hydrad.store.files import ChunkDir, atomic_write, fsync_dir
from hydrad.store.settings import StoreSettings

MANIFEST_VERSION = 1
IDENTITY_KEYS = ("arch", "n_layer", "n_embd", "n_head_kv", "n_vocab", "fingerprint")


def model_key(meta: dict[str, Any]) -> str:
    """The identity KV bytes are portable under: the model's identity (as engines report it in state
    meta, generation.identity()) and the cache types, which change the bytes themselves."""
    model = meta.get("model") or {}
    ident = {k: model.get(k) for k in IDENTITY_KEYS}
    ident["cache_type_k"] = meta.get("cache_type_k")
    ident["cache_type_v"] = meta.get("cache_type_v")
    if meta.get("cache_ns"):  # a tenant's prefixes are keyed apart (hydrad.common.tenants)
        ident["cache_ns"] = meta["cache_ns"]
    return xxhash.xxh3_128_hexdigest(json.dumps(ident, sort_keys=True).encode())


def prefix_chain(mkey: str, tokens: list[int], block: int) -> list[str]:
    """Chained hashes of the token prefix, one per block (the last one may be partial): entry i covers
    tokens[:min((i+1)*block, n)] under the model key and the block size. The last entry is the object key."""
    h = xxhash.xxh3_128_digest(bytes.fromhex(mkey) + block.to_bytes(4, "little"))
    out = []
    arr = np.asarray(tokens, dtype="<i4")
    for s in range(0, len(tokens), block):
        h = xxhash.xxh3_128_digest(h + arr[s:s + block].tobytes())
        out.append(h.hex())
    return out or [h.hex()]


@dataclass(frozen=True)
class Lookup:
    """The longest stored prefix of a token list: restore ``n_tokens`` of object ``key`` (get(key, n_tokens))
    and prefill the rest."""

    key: str
    n_tokens: int
    exact: bool  # the object holds exactly these n_tokens (no truncation)


@dataclass
class _Obj:
    key: str
    mkey: str
    n_tokens: int
    chain: list[str]
    truncatable: bool
    chunks: list[tuple[str, int]]
    size: int  # manifest file size
    mtime: int
    owner: str = ""


class Store:
    """A store directory. Safe across threads and processes (flock), crash-safe by rename ordering."""

    def __init__(self, settings: StoreSettings | None = None, **overrides: Any) -> None:
        self.settings = settings or StoreSettings(**overrides)
        self.dir = self.settings.location()
        self.block = self.settings.block_tokens
        if self.settings.dir is None:  # the pool's directory on a shared tmpfs: this user's alone, or refused
            privatedir.pool_dir(self.dir)
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            for sub in ("chunks", "manifests", "tmp"):
                (self.dir / sub).mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot use {self.dir} as a store directory: {exc}") from exc
        self.chunks = ChunkDir(self.dir / "chunks", self.dir / "tmp", fsync=self.settings.fsync)
        self._mu = threading.Lock()
        self._reading: Counter[str] = Counter()  # objects being read in this process: never evicted
        self._cache: dict[str, tuple[int, int, _Obj]] = {}  # manifest name -> (inode, size, parsed)
        self.bad_manifests: dict[str, str] = {}
        self.objects: dict[str, _Obj] = {}
        self.refs: Counter[str] = Counter()
        with self._lock(fcntl.LOCK_SH):
            self._rescan()

    # ---- locking and the index ---------------------------------------------------------------------

    @contextmanager
    def _lock(self, mode: int) -> Iterator[None]:
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def _manifest_path(self, key: str) -> Path:
        return self.dir / "manifests" / f"{key}.json"

    def _rescan(self) -> None:
        """Rebuild objects and reference counts from the manifests on disk."""
        objects: dict[str, _Obj] = {}
        bad: dict[str, str] = {}
        seen: set[str] = set()
        for f in os.scandir(self.dir / "manifests"):
            if not f.name.endswith(".json"):
                continue
            seen.add(f.name)
            try:
                st = f.stat()
            except FileNotFoundError:
                continue
            cached = self._cache.get(f.name)
            if cached and cached[0] == st.st_ino and cached[1] == st.st_size:
                obj = cached[2]
            else:
                try:
                    obj = self._summarize(json.loads(Path(f.path).read_bytes()), st.st_size)
                except FileNotFoundError:
                    continue
                except (ValueError, KeyError, TypeError) as exc:
                    bad[f.name] = f"unreadable manifest: {exc}"
                    continue
                self._cache[f.name] = (st.st_ino, st.st_size, obj)
            obj.mtime = st.st_mtime_ns
            objects[obj.key] = obj
        for name in set(self._cache) - seen:
            del self._cache[name]
        refs: Counter[str] = Counter()
        for obj in objects.values():
            refs.update({c for c, _ in obj.chunks})
        self.objects, self.refs, self.bad_manifests = objects, refs, bad

    @staticmethod
    def _summarize(m: dict[str, Any], size: int) -> _Obj:
        if m.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {m.get('version')!r}")
        chunks = [(c[0], int(c[1])) for p in m["parts"] for c in p.get("chunks", [])]
        return _Obj(m["key"], m["model_key"], int(m["n_tokens"]), list(m["chain"]), bool(m["truncatable"]),
                    chunks, size, 0, str(m.get("owner") or ""))

    # ---- put ---------------------------------------------------------------------------------------

    def put(self, meta: dict[str, Any], data: bytes, owner: str = "", quota: int = 0) -> str:
        """Store a state (meta as an engine's STATE_GET gives it, with ``tokens``); returns its key.
        The same tokens under the same model replace the earlier object. ``owner`` holds at most
        ``quota`` bytes afterwards (0: no quota of its own), its oldest other objects evicted first."""
        tokens = meta.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise StoreError("meta.tokens must be a list of token ids")
        mkey = model_key(meta)
        chain = prefix_chain(mkey, tokens, self.block)
        key = chain[-1]
        parsed = L.parse(data)
        if parsed.kind == "kv" and parsed.cells and parsed.cells != len(tokens):
            parsed.truncatable = False  # cells and tokens disagree: keep whole, never cut to a prefix
        split = self._divergence(meta, tokens) if parsed.truncatable else None
        pieces = L.cut(data, parsed, self.block, self.settings.blob_chunk_bytes, split)
        parts: list[dict[str, Any]] = []
        with self._lock(fcntl.LOCK_EX), self._mu:
            self._rescan()
            new_bytes = sum(len(p) for ps in pieces if isinstance(ps, list) for p in ps)
            if new_bytes > self.settings.cap_bytes:
                raise StoreError(f"a state of {new_bytes} bytes does not fit the store's cap of {self.settings.cap_bytes}")
            if quota and new_bytes > quota:
                raise StoreError(f"a state of {new_bytes} bytes does not fit its owner's quota of {quota} bytes "
                                 "(store_quota_mib)")
            for part, got in zip(parsed.parts, pieces):
                kind = part[0]
                if kind == "raw":
                    parts.append({"t": "raw", "hex": part[1].hex()})
                elif kind == "cells":
                    parts.append({"t": "cells", "n": part[1]})
                else:
                    assert isinstance(got, list)
                    entry: dict[str, Any] = {"t": kind}
                    if kind == "rows":
                        entry.update(row=part[1], n=part[3])
                    elif kind == "vtrans":
                        entry.update(el=part[1], n_embd=part[2], n=part[4])
                    entry["chunks"] = [[self.chunks.write(p), len(p)] for p in got]
                    parts.append(entry)
            manifest = {
                "version": MANIFEST_VERSION, "key": key, "model_key": mkey, "model": meta.get("model"),
                "meta": {k: v for k, v in meta.items() if k != "tokens"}, "tokens": tokens,
                "n_tokens": len(tokens), "bytes": len(data), "block_tokens": self.block,
                "layout": parsed.kind, "why_blob": parsed.why or None, "cells": parsed.cells,
                "truncatable": parsed.truncatable, "split": split, "chain": chain, "parts": parts,
                "stored_at": time.time(), "owner": owner,
            }
            atomic_write(self._manifest_path(key), json.dumps(manifest, separators=(",", ":")).encode(),
                         self.dir / "tmp", fsync=self.settings.fsync)
            self._rescan()
            if quota:
                self._evict_owner(owner, quota, keep={key})
            self._evict_to_cap(keep={key})
        return key

    def _divergence(self, meta: dict[str, Any], tokens: list[int]) -> int | None:
        """Where ``tokens`` leave the longest matching stored object's tokens (None: nowhere useful)."""
        try:
            hit = self.lookup(meta, tokens)
            if hit is None or hit.exact:
                return None
            m = self.manifest(hit.key)
        except StoreError:
            return None
        n = 0
        for x, y in zip(tokens, m["tokens"]):
            if x != y:
                break
            n += 1
        if not hit.n_tokens <= n < len(tokens):
            return None
        # that object's own split, when it lies in the shared part of this block: the chunk before it is
        # then one that is stored already (sessions diverging a token or two apart share it all the same)
        theirs = m.get("split")
        return theirs if isinstance(theirs, int) and n // self.block * self.block < theirs <= n else n

    # ---- get and lookup ----------------------------------------------------------------------------

    def manifest(self, key: str) -> dict[str, Any]:
        try:
            return json.loads(self._manifest_path(key).read_bytes())
        except FileNotFoundError:
            raise StoreError(f"no object {key} in {self.dir}") from None
        except ValueError as exc:
            raise StoreError(f"manifest of {key} is unreadable: {exc}") from exc

    def get(self, key: str, n_tokens: int | None = None) -> tuple[dict[str, Any], bytearray]:
        """(meta, bytes) of an object, every chunk verified; ``n_tokens`` below the object's length gives
        the state of that prefix (a block boundary, truncatable objects only). Marks the object used."""
        with self._mu:
            self._reading[key] += 1
        try:
            with self._lock(fcntl.LOCK_SH):
                m = self.manifest(key)
                data, n = self._assemble(m, n_tokens)
                try:
                    os.utime(self._manifest_path(key))
                except FileNotFoundError:
                    pass
        finally:
            with self._mu:
                self._reading[key] -= 1
                if not self._reading[key]:
                    del self._reading[key]
        meta = dict(m["meta"])
        meta["tokens"] = m["tokens"][:n]
        meta["n_tokens"] = n
        meta["bytes"] = len(data)
        return meta, data

    def _assemble(self, m: dict[str, Any], n_tokens: int | None) -> tuple[bytearray, int]:
        """The state's bytes, every chunk read straight into its place in one buffer and verified there."""
        n = m["n_tokens"] if n_tokens is None else n_tokens
        full = n == m["n_tokens"]
        if not full:
            if not m["truncatable"] or n <= 0 or n > m["n_tokens"] or n % m["block_tokens"]:
                raise StoreError(f"object {m['key']} cannot give a {n}-token prefix (it holds {m['n_tokens']} "
                                 f"tokens, blocks of {m['block_tokens']}, truncatable={m['truncatable']})")
        if full:
            n_chunks = None
        else:  # per-cell parts: the chunks up to cell n (a block boundary, hence a chunk boundary)
            bounds = L.block_bounds(m["cells"], m["block_tokens"], m.get("split"))
            n_chunks = bounds.index(n)
        plan: list[tuple[dict[str, Any], Any]] = []
        size = 0
        for p in m["parts"]:
            t = p["t"]
            if t == "raw":
                raw = bytes.fromhex(p["hex"])
                plan.append((p, raw))
                size += len(raw)
            elif t == "cells":
                plan.append((p, (p["n"] if full else n).to_bytes(4, "little")))
                size += 4
            else:
                chunks = p["chunks"] if n_chunks is None or t not in ("rows", "vtrans") else p["chunks"][:n_chunks]
                plan.append((p, chunks))
                size += sum(c[1] for c in chunks)
        out = bytearray(size)
        view = memoryview(out)
        at = 0
        for p, what in plan:
            t = p["t"]
            if t in ("raw", "cells"):
                view[at:at + len(what)] = what
                at += len(what)
            elif t == "vtrans":  # blocks of n_embd rows each; the state wants n_embd full rows
                part = sum(c[1] for c in what)
                n_embd = p["n_embd"]
                rows = np.frombuffer(out, dtype=np.uint8, count=part, offset=at).reshape(n_embd, part // n_embd)
                col = 0
                for name, csize in what:
                    piece = bytearray(csize)
                    self.chunks.read_into(name, memoryview(piece), m["key"])
                    width = csize // n_embd
                    rows[:, col:col + width] = np.frombuffer(piece, dtype=np.uint8).reshape(n_embd, width)
                    col += width
                at += part
            else:
                for name, csize in what:
                    self.chunks.read_into(name, view[at:at + csize], m["key"])
                    at += csize
        if full and size != m["bytes"]:
            raise StoreError(f"object {m['key']} reassembles to {size} bytes, its manifest says {m['bytes']}")
        return out, n

    def lookup(self, meta: dict[str, Any], tokens: list[int]) -> Lookup | None:
        """The longest stored prefix of ``tokens`` under meta's model identity: an object holding exactly
        these tokens, else the longest block-aligned prefix some truncatable object (or an object of
        exactly that length) holds. None when nothing matches."""
        with self._lock(fcntl.LOCK_SH), self._mu:
            self._rescan()
            objects = dict(self.objects)
        mkey = model_key(meta)
        chain = prefix_chain(mkey, list(tokens), self.block)
        if tokens and chain[-1] in objects:
            return Lookup(chain[-1], len(tokens), True)
        by_boundary: dict[str, tuple[str, bool]] = {}
        for obj in objects.values():
            if obj.mkey != mkey:
                continue
            full_blocks = obj.n_tokens // self.block
            for i in range(full_blocks):
                h = obj.chain[i]
                exact = (i + 1) * self.block == obj.n_tokens
                if obj.truncatable or exact:
                    if h not in by_boundary or exact:
                        by_boundary[h] = (obj.key, exact)
        for i in range(len(tokens) // self.block - 1, -1, -1):
            hit = by_boundary.get(chain[i])
            if hit:
                return Lookup(hit[0], (i + 1) * self.block, hit[1])
        return None

    # ---- delete, eviction, gc ----------------------------------------------------------------------

    def delete(self, key: str) -> bool:
        with self._lock(fcntl.LOCK_EX), self._mu:
            self._rescan()
            return self._drop(key)

    def _drop(self, key: str) -> bool:
        """Remove a manifest, then the chunks no other manifest uses (caller holds the exclusive lock)."""
        obj = self.objects.pop(key, None)
        if obj is None:
            return False
        self._manifest_path(key).unlink(missing_ok=True)
        if self.settings.fsync:
            fsync_dir(self.dir / "manifests")
        for c in {c for c, _ in obj.chunks}:
            self.refs[c] -= 1
            if self.refs[c] <= 0:
                del self.refs[c]
                self.chunks.remove(c)
        return True

    def used_bytes(self) -> int:
        """What the cap counts: the distinct chunks live manifests use, plus the manifests."""
        sizes: dict[str, int] = {}
        for obj in self.objects.values():
            sizes.update(obj.chunks)
        return sum(sizes.values()) + sum(o.size for o in self.objects.values())

    def owned_bytes(self, owner: str) -> int:
        """What ``owner``'s quota counts: the distinct chunks its objects use, plus their manifests (a
        chunk shared with another owner counts for each)."""
        sizes: dict[str, int] = {}
        mine = [o for o in self.objects.values() if o.owner == owner]
        for obj in mine:
            sizes.update(obj.chunks)
        return sum(sizes.values()) + sum(o.size for o in mine)

    def _evict_owner(self, owner: str, quota: int, keep: set[str]) -> list[str]:
        evicted: list[str] = []
        used = self.owned_bytes(owner)
        for obj in sorted((o for o in self.objects.values() if o.owner == owner), key=lambda o: o.mtime):
            if used <= quota:
                break
            if obj.key in keep or obj.key in self._reading:
                continue
            self._drop(obj.key)
            evicted.append(obj.key)
            used = self.owned_bytes(owner)
        return evicted

    def _evict_to_cap(self, keep: set[str]) -> list[str]:
        evicted: list[str] = []
        used = self.used_bytes()
        if used <= self.settings.cap_bytes:
            return evicted
        for obj in sorted(self.objects.values(), key=lambda o: o.mtime):
            if used <= self.settings.cap_bytes:
                break
            if obj.key in keep or obj.key in self._reading:
                continue
            self._drop(obj.key)
            evicted.append(obj.key)
            used = self.used_bytes()
        return evicted

    def gc(self) -> dict[str, int]:
        """Remove chunks no manifest uses and stray tmp files; enforce the cap. Never touches a chunk a
        live manifest references (the exclusive lock keeps writers out meanwhile)."""
        with self._lock(fcntl.LOCK_EX), self._mu:
            self._rescan()
            removed = removed_bytes = 0
            for name, size in self.chunks.names().items():
                if name not in self.refs:
                    self.chunks.remove(name)
                    removed += 1
                    removed_bytes += size
            tmp = 0
            for f in os.scandir(self.dir / "tmp"):
                os.unlink(f.path)
                tmp += 1
            for sub in os.scandir(self.dir / "chunks"):
                if sub.is_dir() and not any(os.scandir(sub.path)):
                    os.rmdir(sub.path)
            evicted = self._evict_to_cap(keep=set())
        return {"removed_chunks": removed, "removed_bytes": removed_bytes, "removed_tmp": tmp,
                "evicted_objects": len(evicted)}

    # ---- reports -----------------------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        """Recompute every chunk's hash. Bad or missing chunks are listed with the objects using them."""
        with self._lock(fcntl.LOCK_SH), self._mu:
            self._rescan()
            present = self.chunks.names()
            users: dict[str, list[str]] = {}
            for obj in self.objects.values():
                for c, _ in obj.chunks:
                    users.setdefault(c, []).append(obj.key)
            bad = []
            for name in sorted(set(present) | set(users)):
                why = self.chunks.check(name)
                if why:
                    bad.append({"chunk": name, "why": why, "objects": sorted(set(users.get(name, [])))})
            tmp = sum(1 for _ in os.scandir(self.dir / "tmp"))
        return {"ok": not bad and not self.bad_manifests, "chunks": len(present), "objects": len(self.objects),
                "bad_chunks": bad, "bad_objects": sorted({k for b in bad for k in b["objects"]}),
                "bad_manifests": dict(self.bad_manifests),
                "unreferenced_chunks": len(set(present) - set(users)), "tmp_files": tmp}

    def ls(self) -> list[dict[str, Any]]:
        with self._lock(fcntl.LOCK_SH), self._mu:
            self._rescan()
            out = []
            for obj in sorted(self.objects.values(), key=lambda o: -o.mtime):
                try:
                    m = self.manifest(obj.key)
                except StoreError:
                    continue
                model = m.get("model") or {}
                out.append({"key": obj.key, "model": model.get("arch"), "model_id": m["meta"].get("model_id"),
                            "n_tokens": obj.n_tokens, "bytes": m["bytes"], "chunks": len(obj.chunks),
                            "layout": m["layout"], "truncatable": obj.truncatable,
                            "last_used": obj.mtime / 1e9, "owner": obj.owner or None})
        return out

    def stats(self) -> dict[str, Any]:
        with self._lock(fcntl.LOCK_SH), self._mu:
            self._rescan()
            present = self.chunks.names()
            logical = blob = 0
            for obj in self.objects.values():
                logical += sum(s for _, s in obj.chunks)
            for key in self.objects:
                try:
                    if self.manifest(key)["layout"] == "blob":
                        blob += 1
                except StoreError:
                    pass
            used = self.used_bytes()
            tmp = sum(1 for _ in os.scandir(self.dir / "tmp"))
        chunk_bytes = sum(present.values())
        return {"dir": str(self.dir), "objects": len(self.objects), "blob_objects": blob,
                "chunks": len(present), "chunk_bytes": chunk_bytes, "logical_bytes": logical,
                "used_bytes": used, "cap_bytes": self.settings.cap_bytes,
                "dedup_ratio": (logical / chunk_bytes) if chunk_bytes else 1.0,
                "unreferenced_chunks": len(set(present) - set(self.refs)), "tmp_files": tmp,
                "bad_manifests": len(self.bad_manifests), "block_tokens": self.block}

"""Crash-safe file writes and the content-addressed chunk directory.

A file becomes visible only by ``rename`` after its bytes are written and fsynced (and the directory
is fsynced after the rename), so a process killed at any point leaves either the old state or the new
one, plus at most a stray ``tmp/`` file that GC removes. Chunks are renamed into place before the
manifest naming them is, hence no manifest ever points at a missing or half-written chunk.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from hydrad.store.errors import CorruptChunk


def chunk_hash(data: bytes | memoryview) -> str:
    """xxh3-128, hex: fast enough to recompute on every read (GB/s), wide enough that a collision is not
    a practical concern for a cache."""
    return xxhash.xxh3_128_hexdigest(data)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | memoryview, tmp_dir: Path, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in ``tmp_dir`` (same file system):
    write, fsync, rename, fsync the directory."""
    tmp = tmp_dir / f"{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)


class ChunkDir:
    """``chunks/ab/abcdef…``: one file per distinct chunk, named by the xxh3-128 of its bytes."""

    def __init__(self, root: Path, tmp_dir: Path, *, fsync: bool = True) -> None:
        self.root, self.tmp_dir, self.fsync = root, tmp_dir, fsync

    def path(self, name: str) -> Path:
        return self.root / name[:2] / name

    def write(self, data: bytes | memoryview) -> str:
        """Store ``data`` (once), returning its name. An existing file of that name and size is trusted
        (most chunks of a put exist already: re-reading each would halve ingest speed); a damaged one
        is found by the next read, which removes it, so the next put of the same bytes writes it again."""
        name = chunk_hash(data)
        path = self.path(name)
        try:
            if path.stat().st_size == len(data):
                return name
        except FileNotFoundError:
            pass
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, data, self.tmp_dir, fsync=self.fsync)
        return name

    def read(self, name: str, key: str | None = None) -> bytes:
        """The chunk's bytes, verified: a missing chunk or one whose bytes do not hash to its name raises
        CorruptChunk naming it."""
        try:
            data = self.path(name).read_bytes()
        except FileNotFoundError:
            raise CorruptChunk(name, "missing", key) from None
        got = chunk_hash(data)
        if got != name:
            self.remove(name)  # never served again; the next put of these bytes writes it anew
            raise CorruptChunk(name, f"damaged (its bytes hash to {got})", key)
        return data

    def read_into(self, name: str, out: memoryview, key: str | None = None) -> None:
        """The chunk's bytes straight into ``out`` (exactly its size), verified like :meth:`read`: restores
        assemble a state in one buffer without a copy per chunk."""
        try:
            fd = os.open(self.path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptChunk(name, "missing", key) from None
        try:
            got = 0
            while got < len(out):
                n = os.readv(fd, [out[got:]])
                if n == 0:
                    break
                got += n
            extra = os.read(fd, 1)
        finally:
            os.close(fd)
        if got != len(out) or extra:
            self.remove(name)
            raise CorruptChunk(name, "of the wrong size", key)
        h = chunk_hash(out)
        if h != name:
            self.remove(name)  # never served again; the next put of these bytes writes it anew
            raise CorruptChunk(name, f"damaged (its bytes hash to {h})", key)

    def check(self, name: str) -> str | None:
        """Why the chunk is bad, or None when it is good."""
        try:
            self.read(name)
        except CorruptChunk as exc:
            return exc.why
        return None

    def names(self) -> dict[str, int]:
        """Every chunk file present: name -> size."""
        out: dict[str, int] = {}
        if not self.root.is_dir():
            return out
        for sub in os.scandir(self.root):
            if sub.is_dir():
                for f in os.scandir(sub.path):
                    if f.is_file():
                        out[f.name] = f.stat().st_size
        return out

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

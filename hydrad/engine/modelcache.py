"""Which files of an engine's ``models_dir`` the engine fetched itself, how recently each was used, and
the room a new fetch may take (``fetch.models_cache_gib``).

The operator's files and the engine's share one directory (a registry path is relative to it), so the
engine keeps a list of its own: ``.hydra-fetched.json`` beside them, rewritten whole (temporary file,
then rename) after each change. A file not on the list was put there by hand and is never deleted or
counted. Making room deletes the least recently used fetched files first (``last_used``: the end of
its fetch, then the start of every load of it), never one in use (the serving model, a generation
still finishing its requests, the standby, the load's own target); partial files of other models
(``.<name>.hydra-part``, a fetch that stopped) count and go first, oldest first.

One loader thread fetches at a time (an engine runs one load at a time); the lock only keeps a
``touch`` from another load's start out of the middle of a rewrite.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hydrad.common.logs import log_event

log = logging.getLogger("hydrad.fetch")

MANIFEST = ".hydra-fetched.json"
PART_SUFFIX = ".hydra-part"
GIB = 1 << 30


class QuotaExceeded(RuntimeError):
    """No room for a fetch within the quota, even after deleting every fetched file not in use."""


def part_path(final: Path) -> Path:
    """The temporary name a fetch of ``final`` writes under (hidden, in the same directory so that the
    rename is atomic)."""
    return final.with_name(f".{final.name}{PART_SUFFIX}")


@dataclass
class Fetched:
    name: str  # the file's name in models_dir
    size: int
    last_used: float


class ModelCache:
    def __init__(self, models_dir: Path, quota_bytes: int) -> None:
        self.dir = models_dir
        self.quota = quota_bytes
        self._lock = threading.Lock()

    @property
    def manifest(self) -> Path:
        return self.dir / MANIFEST

    def entries(self) -> dict[str, Fetched]:
        """The list as on disk, less files that are gone; an unreadable list reads as empty (its files then
        count as the operator's: kept, never deleted)."""
        try:
            raw = json.loads(self.manifest.read_bytes())
            files = raw["files"] if isinstance(raw, dict) else {}
            out = {n: Fetched(n, int(v["size"]), float(v["last_used"])) for n, v in files.items()
                   if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log_event(log, logging.WARNING, "the list of fetched models cannot be read; treating none as fetched",
                      path=str(self.manifest), error=str(exc))
            return {}
        return {n: e for n, e in out.items() if (self.dir / n).is_file()}

    def _write(self, entries: dict[str, Fetched]) -> None:
        tmp = self.dir / (MANIFEST + ".tmp")
        body = {"files": {n: {"size": e.size, "last_used": e.last_used} for n, e in sorted(entries.items())}}
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.manifest)

    def is_fetched(self, path: Path) -> bool:
        return path.parent == self.dir and path.name in self.entries()

    def add(self, path: Path, size: int) -> None:
        """A fetch completed: ``path`` is the engine's own from now on."""
        with self._lock:
            entries = self.entries()
            entries[path.name] = Fetched(path.name, size, time.time())
            self._write(entries)

    def touch(self, path: Path) -> None:
        """A load of ``path`` starts: it is the most recently used (nothing happens for the operator's files)."""
        with self._lock:
            entries = self.entries()
            if path.parent == self.dir and path.name in entries:
                entries[path.name].last_used = time.time()
                self._write(entries)

    def make_room(self, need: int, fetching: Path, in_use: Iterable[Path]) -> list[str]:
        """Delete least recently used fetched files (and stale partial files) until ``need`` more bytes fit
        the quota beside what is kept; the names deleted. ``QuotaExceeded`` when that cannot be done."""
        keep = {p.name for p in in_use if p.parent == self.dir}
        own_part = part_path(fetching).name
        with self._lock:
            entries = self.entries()
            parts = [p for p in self.dir.glob(f".*{PART_SUFFIX}") if p.name != own_part and p.is_file()]
            candidates: list[tuple[float, str, int]] = []
            for p in parts:
                st = p.stat()
                candidates.append((st.st_mtime - 1e12, p.name, st.st_size))  # stale partials go first
            candidates += [(e.last_used, e.name, e.size) for e in entries.values() if e.name not in keep]
            used = sum(e.size for e in entries.values()) + sum(c[2] for c in candidates if c[0] < 0)
            deleted: list[str] = []
            for _, name, size in sorted(candidates):
                if used + need <= self.quota:
                    break
                try:
                    (self.dir / name).unlink()
                except FileNotFoundError:
                    pass
                entries.pop(name, None)
                used -= size
                deleted.append(name)
                log_event(log, logging.INFO, "fetched model evicted (least recently used)", file=name, bytes=size)
            if deleted:
                self._write(entries)
            if used + need > self.quota:
                held = ", ".join(sorted(keep & set(entries))) or "none"
                raise QuotaExceeded(
                    f"fetching {fetching.name} needs {need / GIB:.2f} GiB but fetch.models_cache_gib allows "
                    f"{self.quota / GIB:.2f} GiB and {used / GIB:.2f} GiB of fetched models are in use ({held}); "
                    "raise the quota or put the file in models_dir by hand")
            return deleted

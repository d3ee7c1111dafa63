"""The store's settings, typed, so a config file and the CLI validate them the same way.

Where a store lives by default: one directory per *pool*, ``<root>/hydra-store/<pool>``, the root
being ``$XDG_RUNTIME_DIR`` (a per-user tmpfs) when set, else ``/dev/shm``. A pool's coordinator and
its engines share that directory (sessions, prefix checkpoints); another pool on the same host, or
a stranger's process, has another, and cannot read or plant KV states in it: the directory is made
mode 0700, and one that is a symbolic link, belongs to another user or is open to others is
refused (:mod:`hydrad.store.store`).

The pool's name is configured (``pool``) or derived from what the coordinator and its engines
both name: the coordinator's bus endpoint (``bus-9500`` for a bus on port 9500; two pools on one
host never share a bus port). A configuration without a bus falls back to the daemon's own name.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

POOL_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
DEFAULT_POOL = "bus-9500"  # the pool of the default coordinator (bus tcp://127.0.0.1:9500)
_POOL_RE = re.compile(POOL_PATTERN)


def store_root() -> Path:
    """tmpfs by default: KV states are a cache, rebuilt by prefill, and RAM-speed reads are the point.
    ``$XDG_RUNTIME_DIR/hydra-store`` when that is set, else ``/dev/shm/hydra-store``."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    return Path(run) / "hydra-store" if run else Path("/dev/shm/hydra-store")


def default_dir(pool: str = DEFAULT_POOL) -> Path:
    """The store directory of ``pool`` when none is configured."""
    return store_root() / pool


def pool_of(bus_endpoint: str | None, fallback: str) -> str:
    """A pool's default name, from the coordinator's bus endpoint as its configuration writes it (the
    coordinator's ``bus``, an engine's ``bus.endpoint``): ``bus-<port>`` for TCP, ``ipc-<hash of the
    path>`` for IPC; ``fallback`` (the daemon's name) without a bus or with a port picked at bind time."""
    if bus_endpoint:
        scheme, _, rest = bus_endpoint.partition("://")
        if scheme == "tcp":
            port = rest.rpartition(":")[2]
            if port.isdigit() and int(port) > 0:
                return f"bus-{int(port)}"
        elif scheme == "ipc" and rest:
            return "ipc-" + hashlib.sha256(rest.encode()).hexdigest()[:12]
    return fallback if _POOL_RE.match(fallback) else "default"


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dir: Path | None = Field(default=None,
                             description="Directory of the store (chunks/, manifests/, tmp/). Unset: the pool's own "
                                         "directory on tmpfs, <root>/hydra-store/<pool> (root $XDG_RUNTIME_DIR, else "
                                         "/dev/shm), made mode 0700 and refused when another user owns it or others "
                                         "may open it.")
    pool: str | None = Field(default=None, pattern=POOL_PATTERN,
                             description="The pool the store belongs to, which names its directory when dir is unset. "
                                         "Unset: the daemon's pool (its pool setting, by default derived from the "
                                         "coordinator's bus endpoint: bus-<port>).")
    cap_bytes: int = Field(default=4 << 30, ge=1,
                           description="Size cap of the stored bytes (chunks plus manifests); past it the "
                                       "least recently used objects are evicted whole.")
    block_tokens: int = Field(default=256, ge=1, le=1 << 20,
                              description="Token block size: KV data is chunked at multiples of this many "
                                          "cells, and prefixes are looked up at these boundaries. Objects "
                                          "stored with different block sizes do not share chunks.")
    blob_chunk_bytes: int = Field(default=1 << 20, ge=4096,
                                  description="Chunk size when a state's bytes do not parse as llama.cpp's "
                                              "per-sequence KV layout and are stored as a plain blob.")
    fsync: bool = Field(default=True,
                        description="fsync chunk and manifest files and their directories before renames "
                                    "count as done (off only for throwaway stores).")

    def in_pool(self, pool: str) -> "StoreSettings":
        """These settings with ``pool`` as the pool when none is configured."""
        return self if self.pool is not None else self.model_copy(update={"pool": pool})

    def location(self) -> Path:
        """The directory: ``dir``, else the pool's default directory."""
        return self.dir if self.dir is not None else default_dir(self.pool or DEFAULT_POOL)

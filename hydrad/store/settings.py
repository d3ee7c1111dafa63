"""The store's settings, typed, so a config file and the CLI validate them the same way."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


def default_dir() -> Path:
    """tmpfs by default: KV states are a cache, rebuilt by prefill, and RAM-speed reads are the point.
    ``$XDG_RUNTIME_DIR`` (a per-user tmpfs) when set, else ``/dev/shm``."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    return Path(run) / "hydra-store" if run else Path("/dev/shm/hydra-store")


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dir: Path = Field(default_factory=default_dir,
                      description="Directory of the store (chunks/, manifests/, tmp/). Default on tmpfs: "
                                  "$XDG_RUNTIME_DIR/hydra-store, else /dev/shm/hydra-store.")
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

"""A file's identity, cheap enough for every load: sha256 over its size and its first and last
``edge`` bytes. The same file gives the same digest; another file at the same path (a retrained
adapter, a re-quantized model) almost surely another, without reading gigabytes."""

from __future__ import annotations

import hashlib
from pathlib import Path


def edge_digest(path: Path, edge: int) -> str:
    """The hex sha256 of ``path``'s size, first ``edge`` bytes and last ``edge`` bytes."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        h.update(f.read(edge))
        if size > edge:
            f.seek(max(edge, size - edge))
            h.update(f.read(edge))
    return h.hexdigest()

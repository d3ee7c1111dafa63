"""Hydra Store: a content-addressed, deduplicated store of KV states on disk (docs/store.md).

Objects are the KV state of a token prefix under a model identity, cut into chunks aligned to token
blocks per layer so that two sessions sharing a prefix share those chunks byte for byte. Usable
alone (``hydractl store``); the coordinator keeps sessions in it (``hydrad.coordinator.sessions``).
"""

from typing import Any

from hydrad.store.errors import CorruptChunk, StoreError
from hydrad.store.settings import StoreSettings

__all__ = ["CorruptChunk", "Lookup", "Store", "StoreError", "StoreSettings"]


def __getattr__(name: str) -> Any:
    """``Store`` and ``Lookup`` on first use: they need numpy, and an engine must load libllama before
    numpy (see ``hydrad.engine.llama.preload_native``) while its settings name the store's settings."""
    if name in ("Store", "Lookup"):
        from hydrad.store import store

        return getattr(store, name)
    raise AttributeError(f"module 'hydrad.store' has no attribute {name!r}")

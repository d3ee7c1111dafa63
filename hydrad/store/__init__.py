"""Hydra Store: a content-addressed, deduplicated store of KV states on disk (docs/store.md).

Objects are the KV state of a token prefix under a model identity, cut into chunks aligned to token
blocks per layer so that two sessions sharing a prefix share those chunks byte for byte. Usable
alone (``hydractl store``); the coordinator keeps sessions in it (``hydrad.coordinator.sessions``).
"""

from hydrad.store.errors import CorruptChunk, StoreError
from hydrad.store.settings import StoreSettings
from hydrad.store.store import Lookup, Store

__all__ = ["CorruptChunk", "Lookup", "Store", "StoreError", "StoreSettings"]

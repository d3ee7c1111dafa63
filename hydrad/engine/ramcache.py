"""The host-memory prompt cache (``cache_ram_mib``, llama-server's ``--cache-ram``).

An engine has few slots, and a slot keeps only the last conversation it served: when a new prompt
takes a slot that held another conversation, that conversation's KV is overwritten, and its next
turn prefills its whole history again. With ``cache_ram_mib`` set, the state of a slot about to be
overwritten is first copied into host memory (an ordinary ``bytes`` object, read on the engine thread
as every KV read is), and a later prompt that begins with a cached conversation gets that prefix
written back into its slot instead of prefilling it (``PrefixShare.extend`` weighs it against
another slot and the Store and takes the longest).

What is kept is bounded by ``cache_ram_mib``: the least recently used states go first, and a state
larger than the whole budget is not kept. States belong to one model generation (a reload empties
the cache) and to one cache namespace (a tenant's key, a LoRA scale set): a prompt is matched only
against its own namespace's states, as slots are. A state is cut to a shorter prefix only where its
layout allows it (a plain KV cache); otherwise only a prompt that extends the whole cached
conversation reuses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from hydrad.engine.generation import common_prefix

MIB = 1 << 20


@dataclass
class CachedPrompt:
    """One conversation's KV state, as ``Generation.read_state`` gave it."""

    generation: int
    owner: str
    tokens: list[int]
    data: bytes


class RamPromptCache:
    """Least-recently-used states of overwritten slots, within ``limit_mib`` of host memory.

    The engine thread puts and takes; INFO and /metrics read ``public()`` from other threads, so the
    counters and the size are read under the lock."""

    def __init__(self, limit_mib: int = 0) -> None:
        self.limit = 0  # bytes
        self.limit_mib = 0  # as configured: -1 = no limit
        self._entries: OrderedDict[int, CachedPrompt] = OrderedDict()
        self._next = 0
        self._bytes = 0
        self._mu = threading.Lock()
        self.stats = {"saved": 0, "restored": 0, "tokens_restored": 0, "evicted": 0, "too_large": 0}
        self.resize(limit_mib)

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def resize(self, limit_mib: int) -> None:
        """The budget changed (a configure): 0 empties and disables the cache, -1 lifts the limit."""
        with self._mu:
            self.limit_mib = limit_mib
            self.limit = (1 << 62) if limit_mib < 0 else limit_mib * MIB
            self._evict_to(self.limit)

    def put(self, generation: int, owner: str, tokens: list[int], data: bytes) -> bool:
        """Keep a state; False when it alone is larger than the budget. A state of the same
        conversation already kept (its tokens a prefix of these) is replaced."""
        size = len(data)
        with self._mu:
            if size > self.limit:
                self.stats["too_large"] += 1
                return False
            for key, e in list(self._entries.items()):
                if e.generation != generation:  # another model's: never matched again
                    self._drop(key)
                elif e.owner == owner and len(e.tokens) <= len(tokens) and tokens[:len(e.tokens)] == e.tokens:
                    self._drop(key)
            self._evict_to(self.limit - size)
            self._entries[self._next] = CachedPrompt(generation, owner, list(tokens), data)
            self._next += 1
            self._bytes += size
            self.stats["saved"] += 1
            return True

    def best(self, generation: int, owner: str, tokens: list[int], limit: int,
             cuttable: bool) -> tuple[int, CachedPrompt | None]:
        """The cached state that gives ``tokens`` the longest prefix, at most ``limit`` tokens: (tokens it
        gives, the state). A state that cannot be cut (``cuttable`` False) counts only whole."""
        found: tuple[int, int, CachedPrompt | None] = (0, -1, None)
        with self._mu:
            for key, e in self._entries.items():
                if e.generation != generation or e.owner != owner:
                    continue
                cp = min(common_prefix(e.tokens, tokens), limit)
                if not cuttable and cp < len(e.tokens):
                    continue
                if cp > found[0]:
                    found = (cp, key, e)
            if found[2] is not None:
                self._entries.move_to_end(found[1])
        return found[0], found[2]

    def restored(self, tokens: int) -> None:
        with self._mu:
            self.stats["restored"] += 1
            self.stats["tokens_restored"] += tokens

    def clear(self) -> None:
        with self._mu:
            self._evict_to(0)

    def public(self) -> dict[str, int]:
        with self._mu:
            return {"limit_mib": self.limit_mib, "entries": len(self._entries), "bytes": self._bytes, **self.stats}

    def _evict_to(self, budget: int) -> None:
        while self._entries and self._bytes > max(0, budget):
            self._drop(next(iter(self._entries)))
            self.stats["evicted"] += 1

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self._bytes -= len(e.data)


__all__ = ["CachedPrompt", "RamPromptCache"]

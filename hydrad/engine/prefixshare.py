"""Prefix checkpoints: a prompt's shared prefix is prefilled once per pool, not once per slot.

llama.cpp reuses a prefix only inside the slot that computed it, so sixteen sessions sharing one
system prompt prefill it sixteen times when they land in different slots, and once more on every
other engine. Two sources give a new request a longer prefix than its own slot holds:

* **another slot of this engine** (another conversation with the same prefix): its state is read, cut to
  the shared cells (``hydrad.store.layout.truncate``) and written into the request's slot, then the
  prefix is **checkpointed** into the Store in the background;
* **the Store** (``prefix.store``, a directory the pool's engines share, on tmpfs): a prompt long
  enough to span a block is tokenized off the engine thread, the longest stored block-aligned
  prefix is looked up and read there (every chunk verified), and the engine thread only writes it
  into the slot;
* **host memory** (``cache_ram_mib``, :mod:`hydrad.engine.ramcache`): the conversations whose slots
  other prompts took.

Either happens only when it gains at least ``min_tokens`` over what the slot already holds; a state
that does not parse as a plain one-stream KV cache (sliding-window or recurrent memory) is never
cut, so nothing is reported as cached that was not reused (the request prefills as before).
``Usage.cached_tokens`` counts what was restored, exactly like a slot's own reuse.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from typing import TYPE_CHECKING

from hydrad.common.logs import log_event
from hydrad.common.tenants import store_owner
from hydrad.engine.generation import Generation, Slot
from hydrad.engine.tokenprefix import common_prefix
from hydrad.engine.kvshift import exact_len
from hydrad.engine.ramcache import RamPromptCache
from hydrad.engine.settings import PrefixSettings
from hydrad.store.errors import StoreError

if TYPE_CHECKING:
    from hydrad.store import Store
    from hydrad.store import layout as L

log = logging.getLogger("hydrad.prefix")
LONG_PREFILL = 256  # new tokens from which a prefill's time says something about the per-token rate


@dataclass
class StoredPrefix:
    """A prefix read from the Store off the engine thread, for the engine thread to write."""

    tokens: list[int]
    data: bytes | bytearray
    generation: int
    read_s: float = 0.0  # seconds the read took (with the write, the restore rate prefill is weighed against)
    owner: str = ""  # the cache namespace it was looked up in


class PrefixShare:
    def __init__(self, settings: PrefixSettings) -> None:
        self.settings = settings
        self._prefill_spt: float | None = None  # seconds per token of recent long prefills (prefill_seen)
        self._restore_spt: float | None = None  # seconds per token of recent restores (read + write)
        self._skips = 0
        self.store: Store | None = None
        if settings.store is not None:
            from hydrad.store import Store  # numpy: only once libllama is loaded (engine.llama.preload_native)

            self.store = Store(settings.store)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hydrad-prefix")
        self._checkpointed: set[str] = set()  # object keys put by this process (no second put)
        self._mu = threading.Lock()
        self.stats = {"shared_from_slot": 0, "restored_from_store": 0, "checkpoints": 0, "checkpoint_failed": 0,
                      "tokens_shared": 0, "tokens_restored": 0, "not_cut": 0,
                      "store_slower_skipped": 0}
        self.last_not_cut: str | None = None
        self._uncuttable: set[int] = set()  # generations whose states cannot be cut: no donor read for them
        self.ram = RamPromptCache()  # sized by the cache_ram_mib parameter (keep_before_overwrite)

    # ----- off the engine thread -------------------------------------------------------------

    def wants_lookup(self, chars: int) -> bool:
        """Whether a prompt of ``chars`` characters could span a stored block (then it is tokenized early)."""
        return self.store is not None and chars >= 2 * self.store.block

    def lookup(self, gen: Generation, tokens: list[int], owner: str = "") -> StoredPrefix | None:
        """Worker thread: the longest stored prefix of ``tokens`` in the cache namespace ``owner`` that beats
        every slot's own, read and verified; None when there is none worth restoring (or the store fails:
        the request prefills)."""
        store = self.store
        if store is None or len(tokens) <= self.settings.min_tokens:
            return None
        held = max((common_prefix(list(s.cache), tokens) for s in gen.slots if not s.foreign and s.owner == owner),
                   default=0)
        try:
            hit = store.lookup(self._meta(gen, owner), tokens)
            if hit is None:
                return None
            n = min(hit.n_tokens, len(tokens) - 1)
            if n < hit.n_tokens:  # an exact hit of the whole prompt: its last token is decoded again
                n = (n // store.block) * store.block
            if n - held < self.settings.min_tokens or n <= 0 or self._prefill_is_faster(n - held):
                return None
            t0 = time.perf_counter()
            meta, data = store.get(hit.key, n)
            read_s = time.perf_counter() - t0
        except (StoreError, OSError) as exc:
            log_event(log, logging.WARNING, "stored prefix not used; the request prefills", error=str(exc))
            return None
        return StoredPrefix(list(meta["tokens"]), data, gen.id, read_s, owner)

    def prefill_seen(self, n_new: int, seconds: float) -> None:
        """Engine thread, at each request's end: its prefill, for the rate a restore must beat. Only long
        prefills count (a few tokens cost mostly fixed overhead and would make prefill look slow)."""
        if n_new >= LONG_PREFILL and seconds > 0:
            spt = seconds / n_new
            self._prefill_spt = spt if self._prefill_spt is None else 0.5 * (self._prefill_spt + spt)

    def _prefill_is_faster(self, n: int) -> bool:
        """Whether prefilling ``n`` tokens here is measured to be quicker than restoring them (a small model
        on a fast GPU prefills faster than a state can be read from tmpfs and copied to the device). Both
        rates are measured: recent long prefills' seconds per token, and recent restores' (read + write)
        seconds per token; every 32nd such decision restores anyway, so the restore rate stays current."""
        if self._restore_spt is None or self._prefill_spt is None:
            return False
        if self._restore_spt < self._prefill_spt:
            return False
        self._skips += 1
        if self._skips % 32 == 0:
            return False
        self.stats["store_slower_skipped"] += 1
        return True

    # ----- on the engine thread ----------------------------------------------------------------

    def extend(self, gen: Generation, slot: Slot, tokens: list[int], keep: int, stored: StoredPrefix | None,
               owner: str = "", quota: int = 0) -> int:
        """After the slot's own reuse (``keep`` tokens): give the slot a longer prefix of ``tokens`` from
        another slot or from the Store, of the request's cache namespace ``owner``, when that gains
        ``min_tokens``; returns the tokens now held. A prefix it checkpoints counts against the
        tenant's Store ``quota`` (bytes, 0: none)."""
        from hydrad.store import layout as L  # numpy, after libllama (preload_native)

        limit = len(tokens) - 1  # the last prompt token is always decoded again, for its logits
        donor, shared = None, keep
        if self.settings.share and gen.id not in self._uncuttable:
            for s in gen.slots:
                if s is slot or s.foreign or not s.cache or s.owner != owner:
                    continue
                cp = min(common_prefix(s.cache, tokens), limit, exact_len(s))  # no shifted KV for others
                if cp > shared:
                    donor, shared = s, cp
        from_store = stored is not None and stored.generation == gen.id and stored.owner == owner \
            and len(stored.tokens) <= limit \
            and tokens[:len(stored.tokens)] == stored.tokens
        if donor is not None and shared - keep >= self.settings.min_tokens \
                and not (from_store and len(stored.tokens) > shared):  # type: ignore[union-attr]
            data = gen.read_state(donor)
            parsed = L.parse(data)
            if not (parsed.truncatable and parsed.cells == len(donor.cache)):
                self._uncut(gen, parsed)
            else:
                prefix = L.truncate(data, parsed, shared)
                if self._write(gen, slot, tokens[:shared], prefix, owner):
                    self.stats["shared_from_slot"] += 1
                    self.stats["tokens_shared"] += shared - keep
                    self._checkpoint(gen, tokens[:shared], prefix, owner, quota)
                    return shared
        if self.ram.enabled:
            best = max(shared if donor is not None else keep,
                       len(stored.tokens) if from_store else 0)  # type: ignore[union-attr]
            got = self._from_ram(gen, slot, tokens, keep, best, limit, owner)
            if got:
                return got
        if from_store and len(stored.tokens) - keep >= self.settings.min_tokens:  # type: ignore[union-attr]
            assert stored is not None
            t0 = time.perf_counter()
            if self._write(gen, slot, stored.tokens, stored.data, owner):
                spt = (stored.read_s + time.perf_counter() - t0) / max(1, len(stored.tokens) - keep)
                self._restore_spt = spt if self._restore_spt is None else 0.5 * (self._restore_spt + spt)
                self.stats["restored_from_store"] += 1
                self.stats["tokens_restored"] += len(stored.tokens) - keep
                return len(stored.tokens)
        return keep

    def keep_before_overwrite(self, gen: Generation, slot: Slot, tokens: list[int], own: bool,
                              limit_mib: int) -> None:
        """Engine thread, before a request takes ``slot``: with ``cache_ram_mib`` set, the conversation the slot
        holds goes to host memory first when the request would overwrite at least ``min_tokens`` of it.
        Not kept: KV moved to new positions (n_cache_reuse), uploads of other engines, image prompts."""
        if limit_mib != self.ram.limit_mib:
            self.ram.resize(limit_mib)
        if not self.ram.enabled or slot.foreign or slot.exact is not None or not slot.cache:
            return
        cached = list(slot.cache)
        kept = common_prefix(cached, tokens) if own else 0
        if len(cached) - kept < self.settings.min_tokens or min(cached) < 0:
            return
        self.ram.put(gen.id, slot.owner or "", cached, bytes(gen.read_state(slot)))

    def _from_ram(self, gen: Generation, slot: Slot, tokens: list[int], keep: int, best: int, limit: int,
                  owner: str) -> int:
        """The longest prefix of ``tokens`` host memory holds, written into ``slot`` when it beats ``best``
        (what the slot, another slot and the Store give) by ``min_tokens``; 0 when it does not."""
        from hydrad.store import layout as L  # numpy, after libllama (preload_native)

        n, cached = self.ram.best(gen.id, owner, tokens, limit, cuttable=gen.id not in self._uncuttable)
        if cached is None or n - max(best, keep) < self.settings.min_tokens:
            return 0
        data = cached.data
        if n < len(cached.tokens):
            parsed = L.parse(data)
            if not (parsed.truncatable and parsed.cells == len(cached.tokens)):
                self._uncut(gen, parsed)
                return 0
            data = L.truncate(data, parsed, n)
        if not self._write(gen, slot, tokens[:n], data, owner):
            return 0
        self.ram.restored(n - keep)
        return n

    def _uncut(self, gen: Generation, parsed: L.Parsed) -> None:
        """A state that cannot be cut to a prefix (e.g. Gemma-3's sliding-window layers keep a second
        cache of only the last window's cells): say so once, count it, and let the request prefill."""
        self.stats["not_cut"] += 1
        why = parsed.why or ("more than one KV cache or stream (sliding-window or hybrid attention)"
                             if parsed.kind == "kv" else "not a plain KV cache")
        if self.stats["not_cut"] == 1:
            log_event(log, logging.INFO, "prefix not shared between slots: this model's KV state cannot be cut "
                      "to a prefix; requests prefill it", why=why)
        self.last_not_cut = why
        if parsed.kind != "kv" or not parsed.truncatable:  # the model's layout, not this state: not again
            self._uncuttable.add(gen.id)

    def _write(self, gen: Generation, slot: Slot, tokens: list[int], data: bytes | bytearray, owner: str) -> bool:
        import numpy as np

        gen.ensure_room(len(tokens), exclude=slot)
        try:
            gen.write_state(slot, tokens, np.frombuffer(data, dtype=np.uint8), owner=owner)
        except RuntimeError as exc:  # refused: the slot keeps what it had (write_state restores it)
            log_event(log, logging.WARNING, "prefix not written into the slot; the request prefills",
                      slot=slot.id, tokens=len(tokens), error=str(exc))
            return False
        return True

    def _checkpoint(self, gen: Generation, tokens: list[int], data: bytes, owner: str = "", quota: int = 0) -> None:
        """Put a shared prefix into the Store, on the worker thread (the engine thread only copied it),
        as its tenant's object (``owner``: the cache namespace; ``quota``: the tenant's, in bytes)."""
        store = self.store
        if store is None:
            return
        meta = {**self._meta(gen, owner), "tokens": tokens, "n_tokens": len(tokens), "bytes": len(data)}
        self._pool.submit(self._put, store, meta, data, store_owner(owner), quota)

    def _put(self, store: Store, meta: dict[str, Any], data: bytes, owner: str = "", quota: int = 0) -> None:
        try:
            hit = store.lookup(meta, meta["tokens"])
            if hit is not None and hit.exact:
                return
            key = store.put(meta, data, owner=owner, quota=quota)
            with self._mu:
                self._checkpointed.add(key)
            self.stats["checkpoints"] += 1
            log_event(log, logging.INFO, "prefix checkpointed", tokens=len(meta["tokens"]), bytes=len(data))
        except (StoreError, OSError) as exc:
            self.stats["checkpoint_failed"] += 1
            log_event(log, logging.WARNING, "prefix not checkpointed", error=str(exc))

    def checkpoint_slot(self, gen: Generation, slot: Slot) -> dict[str, Any]:
        """On demand (engine thread): the slot's whole state into the Store."""
        if self.store is None:
            raise StoreError("this engine has no prefix store (prefix.store)")
        if slot.exact is not None:
            raise StoreError(f"slot {slot.id} holds KV moved to new positions (n_cache_reuse) after token "
                             f"{slot.exact}: it is not what another conversation's prefill would compute")
        data = gen.read_state(slot)
        self._checkpoint(gen, list(slot.cache), bytes(data), slot.owner or "")
        return {"slot": slot.id, "n_tokens": len(slot.cache), "bytes": len(data)}

    @staticmethod
    def _meta(gen: Generation, owner: str = "") -> dict[str, Any]:
        """The Store's key material for this generation's KV, in the cache namespace ``owner`` (the Store
        keys objects by it: hydrad.store.store.model_key)."""
        m = gen.state_meta(gen.slots[0], 0)
        m.pop("tokens", None)
        if owner:
            m["cache_ns"] = owner
        return m

    def public(self) -> dict[str, Any]:
        return {"share": self.settings.share, "store": str(self.store.dir) if self.store else None, **self.stats,
                "last_not_cut": self.last_not_cut, "ram": self.ram.public()}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["PrefixSettings", "PrefixShare", "StoredPrefix"]

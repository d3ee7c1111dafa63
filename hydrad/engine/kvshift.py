"""Moving a slot's KV to other positions (``llama_memory_seq_add``), as llama-server does it:

* the **context shift** (``ctx_shift``): a generation that fills its slot's context drops half of
  the tokens after the first ``n_keep`` and moves the rest down, so it can go on;
* **chunk reuse** (``n_cache_reuse``): a new prompt that parts from the slot's cached one and then
  repeats chunks of it gets those chunks' KV moved to their new positions instead of prefilling them.

Both keep the slot's rule that the KV of ``cache[i]`` sits at position ``i``, but neither leaves the
KV a prefill of the new token list would give: moved tokens were computed after tokens that are
no longer before them (and RoPE is re-applied, not recomputed). ``Slot.exact`` records how far the
slot's KV is still a prefill's: prefix sharing and the Store take nothing past it, and the tail of
a shifted generation is dropped when its request ends (:func:`drop_inexact`), so the slot's next
request is answered as a fresh engine would answer it.

Where the KV cache cannot move positions (``llama_memory_can_shift`` false: multi-position RoPE;
or a cache that cannot drop a middle range, such as recurrent memory) nothing is shifted: the
generation ends at the context's end (finish_reason ``length``), a prompt is prefilled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hydrad.common.logs import log_event

if TYPE_CHECKING:
    from hydrad.engine.generation import Generation, Slot

log = logging.getLogger("hydrad.engine")

CTX_MARGIN = 4  # llama-server keeps n_keep at most n_ctx - 4: a shift always frees some room


def say_if_fixed(ctx: Any, model: str) -> None:
    """At a load: say once when this model's KV cannot move (ctx_shift and n_cache_reuse then do nothing),
    as llama-server says it disables them."""
    if not ctx.can_shift:
        log_event(log, logging.WARNING, "this model's KV cache cannot shift: ctx_shift and n_cache_reuse have no "
                  "effect (a generation ends at the context's end; prompts are prefilled)", model=model)


def exact_len(slot: Slot) -> int:
    """The leading tokens of the slot whose KV is what prefilling them gives."""
    return len(slot.cache) if slot.exact is None else min(slot.exact, len(slot.cache))


def _mark(slot: Slot, n: int) -> None:
    slot.exact = n if slot.exact is None else min(slot.exact, n)


def kept(n_keep: int, prompt_len: int, add_bos: bool, n_ctx: int) -> int:
    """The tokens a shift keeps at the head, as llama-server counts them: ``n_keep`` prompt tokens after
    the BOS the model adds (-1: the whole prompt), at most ``n_ctx - 4``."""
    n = prompt_len if n_keep < 0 else n_keep + (1 if add_bos else 0)
    return max(0, min(n_ctx - CTX_MARGIN, n))


def context_shift(gen: Generation, slot: Slot, n_keep: int) -> int:
    """Drop ``(n_past - n_keep) / 2`` tokens after the first ``n_keep`` of the slot (llama-server's
    ``n_discard``) and move the rest down; returns how many were dropped, 0 when nothing could be
    (the cache cannot shift, or nothing is left to drop), and the slot is then as it was."""
    ctx = gen.ctx
    n_past = len(slot.cache)
    n_left = n_past - n_keep
    n_discard = max(0, min(n_left // 2, n_left - 1))
    if n_discard <= 0 or not ctx.can_shift:
        return 0
    if not ctx.seq_rm(slot.id, n_keep, n_keep + n_discard):  # recurrent memory cannot drop a middle range
        return 0
    ctx.seq_add(slot.id, n_keep + n_discard, n_past, -n_discard)
    del slot.cache[n_keep:n_keep + n_discard]
    _mark(slot, n_keep)
    log_event(log, logging.INFO, "context shift", slot=slot.id, n_keep=n_keep, n_left=n_left, n_discard=n_discard)
    return n_discard


def reuse_chunks(gen: Generation, slot: Slot, tokens: list[int], keep: int, min_chunk: int) -> int:
    """After the ``keep`` tokens the slot's cache shares with ``tokens``: walk both, and move every run of
    at least ``min_chunk`` cached tokens that ``tokens`` repeats at its next position there (cached tokens
    between are skipped, as llama-server's cache reuse walks them). Returns the tokens now reusable: what
    follows them in the slot is stale and the caller drops it. The last prompt token is never reused
    (it is decoded again for its logits)."""
    ctx = gen.ctx
    cache = slot.cache
    limit = len(tokens) - 1
    if not ctx.can_shift or keep >= limit:
        return keep
    head_c = head_p = keep
    while head_c < len(cache) and head_p < limit:
        n = 0
        while head_c + n < len(cache) and head_p + n < limit and cache[head_c + n] == tokens[head_p + n]:
            n += 1
        if n < min_chunk:
            head_c += 1
            continue
        if head_c != head_p:
            if not ctx.seq_rm(slot.id, head_p, head_c):  # a cache that cannot drop a middle range
                break
            ctx.seq_add(slot.id, head_c, head_c + n, head_p - head_c)
            cache[head_p:head_p + n] = cache[head_c:head_c + n]
            _mark(slot, keep)
        head_c += n
        head_p += n
    if head_p > keep:
        log_event(log, logging.DEBUG, "cache reuse", slot=slot.id, prefix=keep, reused=head_p - keep)
    return head_p


def drop_inexact(gen: Generation, slot: Slot) -> None:
    """A shifted generation's end: the slot keeps only the tokens whose KV a prefill gives."""
    if slot.exact is not None:
        gen.truncate(slot, exact_len(slot))
        slot.exact = None

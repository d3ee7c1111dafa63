"""Speculative decoding: drafts by n-gram lookup (llama-server's ngram-simple and ngram-mod) or by a
draft model (:mod:`hydrad.engine.draftmodel`), verified in the step's batch.

An answer that copies its input (an edited file, a quoted passage) repeats runs of tokens that
already sit in its slot. Where the slot's last ``ngram`` tokens occurred before, the tokens that
followed them there are a guess at what comes next: the :class:`Drafter` proposes them (``ngram``:
the run after the latest occurrence; ``ngram-mod``: each next token looked up in turn from the n-gram
ending at the one before, so the draft goes on past the end of that run), the scheduler decodes them in
the same batch as the slot's next token with a logits row for each, and :func:`verify` samples those
rows in order, keeping drafted tokens while the sampler picks exactly them. Each row is sampled as it
would be without a draft (same sampler, same history before it), so the answer is the one plain
decoding gives, only reached in fewer steps; the rows after the first disagreement are dropped and
their KV removed. A draft model's drafts go through the same rows, verification and rollback.

The lookup is an index of the slot's n-grams (a hash of the n tokens → where the latest
occurrence ended), kept per request and filled as its tokens are committed: at most
:data:`INDEX_PER_STEP` positions per step, so a long prompt served from the cache is indexed over a
few steps instead of stalling one. Drafting starts once the index has caught up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

INDEX_PER_STEP = 2048
"""Most positions a step indexes for one request (about 1 ms of the engine thread's time)."""


@dataclass(frozen=True)
class SpecSettings:
    """The engine's speculation parameters (``spec_*`` of the runtime parameters)."""

    n_max: int
    n_min: int
    ngram: int
    kind: str = "ngram"  # ngram, ngram-mod or draft (spec_type)
    p_min: float = 0.0  # a draft model's least probability of a drafted token


def settings_of(params: object) -> SpecSettings | None:
    """The speculation the parameters ask for; None when off."""
    kind = getattr(params, "spec_type", "none")
    if kind == "none":
        return None
    return SpecSettings(n_max=params.spec_n_max, n_min=params.spec_n_min,  # type: ignore[attr-defined]
                        ngram=params.spec_ngram_size, kind=kind, p_min=params.spec_p_min)  # type: ignore[attr-defined]


MEMORY_ENTRIES = 1 << 18
"""n-grams an engine's ngram-mod memory holds (about 30 MB) before it forgets them all at once, as
llama-server's table is emptied when a quarter of its entries are taken."""

LOW_ACCEPT, LOW_STREAK = 0.25, 5
"""ngram-mod forgets its memory after this many drafts in a row of which less than this share was accepted
(llama-server's rule): what it remembers has stopped predicting what this engine writes."""


class Memory:
    """ngram-mod's n-grams across requests (hash of an n-gram → the token that followed its latest
    occurrence), one map per cache namespace, so that an answer's drafts may come from an earlier answer
    of the same namespace but never from another's text. Owned by the generation; engine thread only."""

    def __init__(self, limit: int = MEMORY_ENTRIES) -> None:
        self.limit = limit
        self.maps: dict[str, dict[int, int]] = {}

    def of(self, namespace: str) -> dict[int, int]:
        return self.maps.setdefault(namespace, {})

    def bound(self) -> None:
        """Forget everything once the maps hold more than :attr:`limit` n-grams together."""
        if sum(len(m) for m in self.maps.values()) > self.limit:
            for m in self.maps.values():
                m.clear()


@dataclass
class Drafter:
    """One request's n-gram index over its slot's tokens, its draft in flight, and its counts."""

    settings: SpecSettings
    # hash of an n-gram → ngram: the position after its latest occurrence in the slot; ngram-mod: the token
    # there (a map of the engine's Memory, shared with the namespace's other requests)
    last: dict[int, int] = field(default_factory=dict)
    memory: Memory | None = None  # ngram-mod: whose map ``last`` is
    indexed: int = 0  # positions below this are in ``last``
    draft: list[int] = field(default_factory=list)  # decoded in the current step after the slot's next token
    row: int = -1  # the batch row of the slot's next token (the draft's rows follow it)
    n_drafted: int = 0  # llama-server's draft_n
    n_accepted: int = 0  # llama-server's draft_n_accepted
    n_low: int = 0  # ngram-mod: drafts in a row with little of them accepted

    def _catch_up(self, hist: list[int]) -> bool:
        """Index the n-grams of ``hist`` that are followed by a token of it, oldest first (a later
        occurrence replaces an earlier one); True once all are."""
        n = self.settings.ngram
        top = len(hist) - 1  # the n-gram ending at the last token is what is looked up, not indexed
        p = max(self.indexed, n)
        stop = min(top, p + INDEX_PER_STEP)
        last = self.last
        if self.memory is not None:
            for q in range(p, stop + 1):
                last[hash(tuple(hist[q - n:q]))] = hist[q]
            if stop >= p:
                self.memory.bound()
        else:
            for q in range(p, stop + 1):
                last[hash(tuple(hist[q - n:q]))] = q
        self.indexed = max(self.indexed, stop + 1)
        return stop >= top

    def propose(self, hist: list[int], room: int) -> list[int]:
        """The draft to decode after ``hist`` (the slot's committed tokens, its next token last), at most
        ``room`` and ``n_max`` tokens; empty when there is none, or the one found is shorter than ``n_min``
        (before it is cut to ``room``).
        ``ngram``: the tokens that followed the latest earlier occurrence of its last n-gram. ``ngram-mod``:
        the token that followed it (in this answer or an earlier one), then the one that followed the
        n-gram ending at that token, and so on (the draft's own tokens included)."""
        s = self.settings
        if len(hist) <= s.ngram or not self._catch_up(hist):
            return []
        # found up to n_max, judged against n_min, and only then cut to the room, as llama.cpp does: near
        # the answer's end the room is short, and a draft refused for it there cost a step per token
        n, last, limit = s.ngram, self.last, s.n_max
        at = last.get(hash(tuple(hist[-n:])))
        if at is None:
            return []
        if self.memory is not None:
            draft = [at]
            window = hist[len(hist) - n + 1:] + draft
            while len(draft) < limit:
                tok = last.get(hash(tuple(window)))
                if tok is None:
                    break
                draft.append(tok)
                del window[0]
                window.append(tok)
        else:
            draft = hist[at:at + limit]
        if not draft or len(draft) < s.n_min:
            return []
        return draft[:room]

    def judged(self, accepted: int, drafted: int) -> None:
        """ngram-mod: after each draft verified, forget the memory after :data:`LOW_STREAK` poor drafts in a
        row (this request indexes its own tokens again)."""
        if self.memory is None:
            return
        self.n_low = self.n_low + 1 if accepted < LOW_ACCEPT * drafted else 0
        if self.n_low >= LOW_STREAK:
            self.last.clear()
            self.indexed = 0
            self.n_low = 0


def start(settings: SpecSettings, memory: Memory | None, namespace: str) -> Drafter:
    """A request's drafter: ngram-mod's index is the engine's memory for its cache namespace."""
    if settings.kind == "ngram-mod" and memory is not None:
        return Drafter(settings, last=memory.of(namespace), memory=memory)
    return Drafter(settings)


def add_drafts(gen: Any, slots: list[Any], stats: Any) -> None:
    """Each speculating slot's draft (``slots``: the generation's slots whose next token this step
    decodes), decoded after that token with a logits row per drafted token: as many as the step's first
    ubatch, the answer's token limit, the slot's context and a shared KV pool leave room for. A draft
    model drafts for all of them at once (its positions batched over the slots), each with the room
    reserved for it; an n-gram lookup slot by slot, each taking what the ones before left.

    Within the first ubatch, so that llama.cpp places the whole step's tokens at once: a sliding-window
    cache (Gemma-3) may reuse a cell its window no longer shows the newest position of a sequence, and
    a draft split over two ubatches would move that position on before its own end, letting the second
    ubatch overwrite a cell the tokens after a rejected draft still attend to."""
    batch, ctx = gen.batch, gen.ctx
    pool = ctx.n_ctx - sum(len(s.cache) for s in gen.slots) if gen.params.kv_unified else ctx.n_ctx
    left = min(batch.capacity, ctx.n_ubatch) - batch.n

    def room_of(slot: Any) -> int:
        a = slot.active
        return min(left, a.max_tokens - a.n_gen - 1, ctx.n_ctx_seq - len(slot.cache) - 2, pool - 1,
                   a.spec.settings.n_max)

    model = gen.draft if slots and slots[0].active.spec.settings.kind == "draft" else None
    if model is not None:
        wants: list[tuple[Any, int]] = []
        for slot in slots:
            room = room_of(slot)
            if room > 0:
                wants.append((slot, room))
                left, pool = left - room, pool - room
        p_min = slots[0].active.spec.settings.p_min
        drafts = model.propose([(slot.id, slot.cache, room) for slot, room in wants], p_min)
        for slot, _ in wants:
            draft = drafts.get(slot.id, [])
            if draft and len(draft) >= slot.active.spec.settings.n_min:
                _add(gen, slot, draft, stats)
        return
    for slot in slots:
        room = room_of(slot)
        draft = slot.active.spec.propose(slot.cache, room) if room > 0 else []
        if draft:
            _add(gen, slot, draft, stats)
            left, pool = left - len(draft), pool - len(draft)


def _add(gen: Any, slot: Any, draft: list[int], stats: Any) -> None:
    """``draft`` into the step's batch after the slot's next token, a logits row each."""
    spec: Drafter = slot.active.spec
    spec.row = gen.batch.n
    gen.batch.add_run(draft, len(slot.cache), slot.id, True, output_all=True)
    slot.cache.extend(draft)
    spec.draft = draft
    spec.n_drafted += len(draft)
    stats.spec_draft_tokens_total += len(draft)
    stats.spec_drafts_total += 1


def verify(gen: Any, slot: Any, a: Any, stats: Any, on_token: Callable[[int], None]) -> None:
    """The drafted rows of request ``a``'s slot, in order, once its next token's row was sampled (and
    handed to ``on_token``): while the token sampled is the one drafted next, that token is already
    decoded and the row after it is sampled in turn, each as plain decoding would (the same sampler,
    the same history before it); what follows the first disagreement, or the answer's end, is taken
    back from the slot, its KV included."""
    spec: Drafter = a.spec
    draft, spec.draft = spec.draft, []
    del slot.cache[len(slot.cache) - len(draft):]  # the committed tokens, the next one last
    kept = 0
    try:
        for j, want in enumerate(draft):
            if slot.active is not a or a.next_token != want:
                break
            slot.cache.append(want)
            a.next_token = -1
            kept += 1
            spec.n_accepted += 1  # (before the token it leads to: that one may end the answer and report it)
            stats.spec_accepted_tokens_total += 1
            on_token(a.sampler.sample(gen.ctx, spec.row + j))
    finally:
        gen.ctx.seq_rm(slot.id, len(slot.cache), -1)
        spec.judged(kept, len(draft))


def take_back(gen: Any, slot: Any, spec: Drafter) -> None:
    """A draft decoded and never verified (its request ended while the device computed it) leaves the
    slot: the slot's tokens are the answer's, not a guess at its continuation."""
    if spec.draft:
        del slot.cache[len(slot.cache) - len(spec.draft):]
        gen.ctx.seq_rm(slot.id, len(slot.cache), -1)
        spec.draft = []

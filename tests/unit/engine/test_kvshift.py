"""kvshift's arithmetic against llama-server's (tools/server/server-context.cpp), on a context that records
the calls it gets and keeps a position per cell: the shift's n_keep/n_discard, the chunk walk, and the
bookkeeping of how far a slot's KV is a prefill's (Slot.exact). The real KV moves are tested end to end in
tests/integration/test_context_shift.py."""

from __future__ import annotations

from typing import Any

from hydrad.engine import kvshift
from hydrad.engine.generation import Generation, Slot


class Cells:
    """One sequence's KV as llama.cpp keeps it: a position per cell (its token is what the cell holds)."""

    def __init__(self, tokens: list[int], can_shift: bool = True, cuts: bool = True) -> None:
        self.cells = {p: t for p, t in enumerate(tokens)}  # position -> token
        self.can_shift, self.cuts = can_shift, cuts
        self.calls: list[tuple[Any, ...]] = []

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> bool:
        self.calls.append(("rm", p0, p1))
        if not self.cuts and p0 > 0:
            return False
        end = max(self.cells, default=-1) + 1 if p1 < 0 else p1
        for p in [p for p in self.cells if (p0 < 0 or p >= p0) and p < end]:
            del self.cells[p]
        return True

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("add", p0, p1, delta))
        moved = {p + delta: t for p, t in self.cells.items() if p0 <= p < p1}
        self.cells = {p: t for p, t in self.cells.items() if not p0 <= p < p1} | moved

    def tokens(self) -> list[int]:
        return [self.cells[p] for p in sorted(self.cells)]


class Gen:
    def __init__(self, ctx: Cells) -> None:
        self.ctx = ctx

    truncate = Generation.truncate
    reset_slot = Generation.reset_slot


def test_kept_counts_as_llama_server() -> None:
    assert kvshift.kept(-1, 30, True, 256) == 30  # the whole prompt
    assert kvshift.kept(8, 30, True, 256) == 9  # n_keep prompt tokens after the BOS
    assert kvshift.kept(8, 30, False, 256) == 8
    assert kvshift.kept(1000, 2000, False, 256) == 252  # at most n_ctx - 4


def test_a_shift_drops_half_after_n_keep_and_moves_the_rest_down() -> None:
    slot = Slot(0, cache=list(range(100, 355)))  # 255 tokens: the next one would fill 256
    ctx = Cells(slot.cache)
    n = kvshift.context_shift(Gen(ctx), slot, 31)  # type: ignore[arg-type]
    assert n == (255 - 31) // 2 == 112
    assert ctx.calls == [("rm", 31, 143), ("add", 143, 255, -112)]
    assert slot.cache == list(range(100, 131)) + list(range(243, 355)) == ctx.tokens()
    assert slot.exact == 31 and kvshift.exact_len(slot) == 31
    kvshift.drop_inexact(Gen(ctx), slot)  # type: ignore[arg-type]
    assert slot.cache == list(range(100, 131)) == ctx.tokens() and slot.exact is None


def test_no_shift_where_the_cache_cannot_move_or_drop_a_middle() -> None:
    for ctx in (Cells(list(range(255)), can_shift=False), Cells(list(range(255)), cuts=False)):
        slot = Slot(0, cache=list(range(255)))
        assert kvshift.context_shift(Gen(ctx), slot, 10) == 0  # type: ignore[arg-type]
        assert slot.cache == list(range(255)) and slot.exact is None and not any(c[0] == "add" for c in ctx.calls)


def test_chunks_the_prompt_repeats_are_moved_to_their_new_positions() -> None:
    head, a, b, c = [1, 2, 3], [10, 11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35]
    slot = Slot(0, cache=head + a + b + c)
    ctx = Cells(slot.cache)
    gen = Gen(ctx)
    prompt = head + c + [99]  # a and b dropped (the walk skips cached tokens, never the prompt's)
    keep, moved = Generation.reuse_prefix(gen, slot, prompt, min_chunk=4)  # type: ignore[arg-type]
    assert (keep, moved) == (len(head) + len(c), len(c))
    assert ctx.calls[:2] == [("rm", 3, 10), ("add", 10, 16, -7)]  # llama-server's seq_rm(head_p, head_c), seq_add
    assert slot.cache == head + c == ctx.tokens()  # c now sits right after the head
    assert sorted(ctx.cells) == list(range(len(head) + len(c)))
    assert slot.exact == len(head)  # c's KV was computed after a and b
    # a chunk shorter than min_chunk is not reused: the shared prefix only
    slot2 = Slot(0, cache=head + a + b + c)
    prompt = head + b + [77] + c + [99]  # b alone (2 tokens) is too short, and the walk cannot skip it
    keep2, moved2 = Generation.reuse_prefix(Gen(Cells(slot2.cache)), slot2, prompt, min_chunk=4)  # type: ignore[arg-type]
    assert (keep2, moved2) == (len(head), 0) and slot2.exact is None


def test_the_last_prompt_token_is_never_reused() -> None:
    cache = [1, 2, 3, 4, 5, 6, 7, 8]
    slot = Slot(0, cache=list(cache))
    prompt = cache[:1] + cache[3:]  # 2 and 3 dropped
    keep, moved = Generation.reuse_prefix(Gen(Cells(cache)), slot, prompt, min_chunk=2)  # type: ignore[arg-type]
    assert (keep, moved) == (len(prompt) - 1, len(prompt) - 2)  # 4..7 moved; 8, the last, is decoded again
    assert slot.cache == prompt[:-1]

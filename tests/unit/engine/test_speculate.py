"""The n-gram lookup that proposes drafts: the latest earlier occurrence of the slot's last n tokens, the
tokens after it bounded by n_max and the room given, none shorter than n_min, and a long history
indexed over several steps rather than in one."""

from __future__ import annotations

import pytest

from hydrad.engine import speculate
from hydrad.engine.speculate import Drafter, SpecSettings


def drafter(n_max: int = 16, n_min: int = 0, ngram: int = 3) -> Drafter:
    return Drafter(SpecSettings(n_max=n_max, n_min=n_min, ngram=ngram))


def test_latest_earlier_occurrence_is_copied() -> None:
    d = drafter()
    hist = [1, 2, 3, 10, 11, 9, 1, 2, 3, 20, 21, 22, 9, 1, 2, 3]
    assert d.propose(hist, room=16) == [20, 21, 22, 9, 1, 2, 3]  # the second 1 2 3, not the first
    assert d.propose(hist + [30], room=16) == []  # 2 3 30 never occurred


def test_bounds_room_n_max_n_min() -> None:
    hist = list(range(40)) + list(range(3))
    assert drafter().propose(hist, room=5) == [3, 4, 5, 6, 7]
    assert drafter(n_max=2).propose(hist, room=16) == [3, 4]
    assert drafter(n_min=5).propose([5, 6, 7, 8, 5, 6, 7], room=16) == []  # only 8 5 6 7 follow
    assert drafter(n_min=4).propose([5, 6, 7, 8, 5, 6, 7], room=16) == [8, 5, 6, 7]
    assert drafter().propose([1, 2, 3], room=16) == []  # nothing before the n-gram itself


def test_grows_with_the_history() -> None:
    d = drafter(ngram=2)
    hist = [7, 8, 9]
    assert d.propose(hist, room=16) == []
    hist += [7, 8]
    assert d.propose(hist, room=16) == [9, 7, 8]
    hist += [4]
    assert d.propose(hist, room=16) == []
    hist += [9, 7]  # 9 7 was followed by 8
    assert d.propose(hist, room=16) == [8, 4, 9, 7]


def test_long_history_is_indexed_over_several_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speculate, "INDEX_PER_STEP", 100)
    d = drafter()
    hist = [1, 2, 3, 4] + [5] * 300 + [1, 2, 3]
    steps = 0
    while not (draft := d.propose(hist, room=16)) and steps < 10:
        steps += 1
    assert draft == [4] + [5] * 15
    assert steps == 3  # 306 positions at 100 a step


def test_settings_of_params() -> None:
    from hydrad.common.params import RuntimeParams

    assert speculate.settings_of(RuntimeParams()) is None
    on = RuntimeParams(spec_type="ngram-simple", spec_n_max=8, spec_n_min=2, spec_ngram_size=4)
    assert speculate.settings_of(on) == SpecSettings(n_max=8, n_min=2, ngram=4)


def test_ngram_mod_looks_each_token_up_in_turn() -> None:
    """ngram-mod: the token after the latest occurrence of the last n-gram, then the token after the n-gram
    ending at that one, and so on: past the end of the run the lookup started from (ngram copies only that
    run), bounded by room and n_max; none when the one found is shorter than n_min, but a draft cut short
    by the room is kept (llama.cpp's rule: near the answer's end the room is short)."""
    def mod(**kw: int) -> Drafter:
        settings = SpecSettings(n_max=kw.get("n_max", 16), n_min=kw.get("n_min", 0), ngram=2, kind="ngram-mod")
        return speculate.start(settings, speculate.Memory(), "")

    hist = [1, 2, 3, 4, 9, 3, 4, 5, 6, 1, 2]
    assert drafter(ngram=2).propose(hist, room=16) == [3, 4, 9, 3, 4, 5, 6, 1, 2]  # the run after 1 2
    # 1 2 → 3; 2 3 → 4; 3 4 → 5 (its latest occurrence); 4 5 → 6; 5 6 → 1; 6 1 → 2; 1 2 → 3 ... a cycle
    assert mod().propose(hist, room=16) == [3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    assert mod().propose(hist, room=5) == [3, 4, 5, 6, 1]
    assert mod(n_max=3).propose(hist, room=16) == [3, 4, 5]
    assert mod(n_min=4).propose(hist, room=3) == [3, 4, 5]  # the room cuts a draft found long enough
    assert mod(n_max=3, n_min=4).propose(hist, room=16) == []  # the draft found is shorter than n_min
    assert drafter(ngram=2, n_min=4).propose(hist, room=2) == [3, 4]  # ngram-simple: the same rule
    assert mod().propose(hist + [7], room=16) == []  # 2 7 never occurred


def test_settings_of_each_kind() -> None:
    from hydrad.common.params import RuntimeParams

    mod = RuntimeParams(spec_type="ngram-mod", spec_n_max=64, spec_n_min=48, spec_ngram_size=24)
    assert speculate.settings_of(mod) == SpecSettings(n_max=64, n_min=48, ngram=24, kind="ngram-mod")
    drafting = RuntimeParams(spec_type="draft-simple", spec_draft_model="d.gguf", spec_p_min=0.5)
    assert speculate.settings_of(drafting) == SpecSettings(n_max=16, n_min=0, ngram=12, kind="draft", p_min=0.5)


def test_ngram_mod_remembers_earlier_answers_of_its_namespace_only() -> None:
    """ngram-mod's n-grams outlive the request that indexed them, in the engine's memory, per cache
    namespace; the memory is bounded (forgotten whole past its limit) and forgotten after a streak of poor
    drafts."""
    settings = SpecSettings(n_max=8, n_min=0, ngram=2, kind="ngram-mod")
    memory = speculate.Memory(limit=50)
    first = speculate.start(settings, memory, "a")
    assert first.propose([1, 2, 3, 4, 5, 6, 7], room=8) == []  # 6 7 never occurred before
    assert speculate.start(settings, memory, "a").propose([9, 9, 1, 2], room=3) == [3, 4, 5]  # from the first
    assert speculate.start(settings, memory, "b").propose([9, 9, 1, 2], room=3) == []  # another namespace
    assert speculate.start(settings, speculate.Memory(), "a").propose([9, 9, 1, 2], room=3) == []
    d = speculate.start(settings, memory, "a")
    d.propose([9, 9, 1, 2], room=3)
    for _ in range(speculate.LOW_STREAK - 1):
        d.judged(0, 3)
    d.judged(3, 3)  # a good draft ends the streak
    for _ in range(speculate.LOW_STREAK - 1):
        d.judged(0, 4)
    assert memory.of("a")
    d.judged(0, 4)
    assert memory.of("a") == {} and d.indexed == 0
    big = speculate.start(settings, memory, "b")
    big.propose(list(range(100, 160)), room=8)  # 58 n-grams: past the limit, all forgotten
    assert sum(len(m) for m in memory.maps.values()) == 0

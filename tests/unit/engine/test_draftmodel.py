"""The draft model's side of speculative decoding, on the real SmolLM2 (drafting for itself): the
vocabulary check, the draft context's sequences kept level with their slots (a rejected tail removed, a
new prompt brought in over several steps), and the bounds of a draft (room, p_min, several slots at once)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.engine import draftmodel, llama
from hydrad.engine.draftmodel import DraftModel, VocabMismatch

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def target(smollm_path_module: Path) -> Iterator[llama.Model]:
    model = llama.Model.load(smollm_path_module, RuntimeParams())
    yield model
    model.free()


@pytest.fixture(scope="module")
def smollm_path_module() -> Path:
    from tests.conftest import SMOLLM, _need

    return _need(SMOLLM)


def params(path: Path, **kw: object) -> RuntimeParams:
    return RuntimeParams(n_ctx=512, n_parallel=2, n_threads=1, spec_type="draft", spec_draft_model=str(path), **kw)


@pytest.fixture
def draft(target: llama.Model, smollm_path_module: Path) -> Iterator[DraftModel]:
    d = DraftModel.load(target, params(smollm_path_module), smollm_path_module.parent)
    yield d
    d.free()


def test_own_parameters(smollm_path_module: Path) -> None:
    p = params(smollm_path_module, spec_draft_n_ctx=256, spec_draft_n_gpu_layers=0, rope_freq_base=5000.0,
               n_gpu_layers=7)
    own = draftmodel.draft_params(p)
    assert (own.n_ctx, own.n_gpu_layers, own.rope_freq_base, own.n_parallel) == (256, 0, 0.0, 2)
    assert draftmodel.draft_params(params(smollm_path_module)).n_ctx == 512  # 0: the model's n_ctx


def test_a_vocabulary_is_compared(target: llama.Model, gemma_path: Path, smollm_path_module: Path) -> None:
    other = llama.Model.load(gemma_path, RuntimeParams())
    try:
        why = draftmodel.vocab_mismatch(target, other)
        assert why is not None and f"{target.n_vocab} tokens against {other.n_vocab}" == why
    finally:
        other.free()
    with pytest.raises(VocabMismatch, match=rf"{gemma_path.name} cannot draft for {smollm_path_module.name}"):
        DraftModel.load(target, params(gemma_path), gemma_path.parent)
    with pytest.raises(llama.LoadError, match="spec_draft_model: no such file: nope.gguf"):
        DraftModel.load(target, params(Path("nope.gguf")), smollm_path_module.parent)


def test_draft_is_the_greedy_continuation_and_the_sequence_follows_the_slot(target: llama.Model,
                                                                            draft: DraftModel) -> None:
    hist = target.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,", add_special=False)
    got = draft.propose([(0, hist, 6)], 0.0)[0]
    assert len(got) == 6 and target.detokenize(got) == b" 12, 1"
    assert draft.held[0] == hist + got[:-1]  # the last drafted token is the served model's to decode
    # two of them accepted, then the served model's own token: the rejected tail leaves the sequence, and
    # the draft from there is the one a fresh sequence makes for the same tokens
    later = hist + got[:2] + [target.tokenize(" 99", add_special=False)[0]]
    again = draft.propose([(0, later, 4)], 0.0)[0]
    assert draft.held[0][:len(later)] == later
    fresh = draft.propose([(1, later, 4)], 0.0)[1]
    assert again == fresh
    # room bounds the draft: one token, nothing decoded past the history
    assert len(draft.propose([(0, later, 1)], 0.0)[0]) == 1 and draft.held[0] == later
    # p_min: a token the draft model is less sure of than that ends the draft before it
    assert draft.propose([(0, later, 4)], 1.0) == {}


def test_two_slots_draft_in_the_same_batches(target: llama.Model, draft: DraftModel) -> None:
    a = target.tokenize("a b c d e f g h", add_special=False)
    b = target.tokenize("Monday, Tuesday, Wednesday,", add_special=False)
    both = draft.propose([(0, a, 3), (1, b, 5)], 0.0)
    assert len(both[0]) == 3 and len(both[1]) == 5
    assert both[1] == draft.propose([(1, b, 5)], 0.0)[1]  # alone, the same draft


def test_a_long_prompt_is_brought_in_over_several_steps(target: llama.Model, draft: DraftModel,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(draftmodel, "CATCH_UP_PER_STEP", 8)
    hist = target.tokenize("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                           "fifteen sixteen seventeen", add_special=False)
    assert 16 < len(hist) <= 24
    steps = 0
    while not (got := draft.propose([(0, hist, 3)], 0.0)):
        steps += 1
        assert len(draft.held[0]) == 8 * steps  # 8 tokens of it a step, no draft meanwhile
    assert steps == 2 and len(got[0]) == 3

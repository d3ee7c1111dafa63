"""The sampling shortcuts against llama.cpp's own sampler chain, in process on the real models (the
greedy argmax; a sampled request's top-k preselection): the same token every step, with and without
banned tokens (``ignore_eos``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from hydrad.engine import llama, sampling
from hydrad.engine.batch import Batch
from hydrad.common.params import RuntimeParams


def _greedy(ban: tuple[int, ...] = (), seed: int = 1) -> sampling.Sampling:
    return sampling.Sampling(temperature=0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                          frequency_penalty=0, presence_penalty=0, seed=seed, ban=ban)


def _sampled(ban: tuple[int, ...] = (), seed: int = 7) -> sampling.Sampling:
    return sampling.Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                          frequency_penalty=0, presence_penalty=0, seed=seed, ban=ban)


def _shortcut_agrees(path: Path, make: Callable[..., sampling.Sampling], shortcut: str, prompt: str,
                     steps: int) -> list[int]:
    """Decode ``steps`` tokens of ``prompt``; at every step a sampler taking ``shortcut`` (the
    attribute that says so) and the full chain (a sampler told of no vocabulary takes none), built
    from the same ``make(ban, seed)``, must pick the same token, without and with the end-of-generation
    tokens banned. Returns the tokens picked."""
    llama.preload_native()
    params = RuntimeParams(n_gpu_layers=0, n_ctx=512, n_parallel=1, n_threads=2)
    model = llama.Model.load(path, params)
    ctx = llama.Context(model, params)
    batch = Batch(512)
    samplers: list[sampling.Sampler] = []
    try:
        eog = tuple(model.eog_tokens())
        fast, chain = sampling.Sampler(make((), 1), model.n_vocab), sampling.Sampler(make((), 1), 0)
        fast_ban, chain_ban = sampling.Sampler(make(eog, 9), model.n_vocab), sampling.Sampler(make(eog, 9), 0)
        samplers = [fast, chain, fast_ban, chain_ban]
        assert getattr(fast, shortcut) and getattr(fast_ban, shortcut)
        assert not getattr(chain, shortcut) and not getattr(chain_ban, shortcut)
        tokens = model.tokenize(prompt, True, False)
        batch.clear()
        idx = batch.add_run(tokens, 0, 0, True)
        out: list[int] = []
        for step in range(steps):
            assert batch.decode(ctx) == 0
            # the banned pair first: a shortcut writes -inf into the row it reads
            want_ban = chain_ban.sample(ctx, idx)
            want = chain.sample(ctx, idx)
            got = fast.sample(ctx, idx)
            assert got == want, (step, got, want)
            assert fast_ban.sample(ctx, idx) == want_ban and want_ban not in eog
            out.append(got)
            batch.clear()
            idx = batch.add(got, len(tokens) + step, 0, True)
        return out
    finally:
        for smp in samplers:
            smp.free()
        batch.free()
        ctx.free()
        model.free()


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_argmax_picks_what_the_greedy_chain_picks(which: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(f"{which}_path")
    out = _shortcut_agrees(path, _greedy, "argmax", "The three primary colours are", 24)
    assert len(set(out)) > 3  # a real continuation, not one token repeated


def test_top_k_preselection_samples_what_the_full_chain_samples(gemma_path: Path) -> None:
    """A sampled request's chain run on the row's top-k candidates (found with numpy) against the same
    chain over all n_vocab logits (llama_sampler_sample), same seed: the same token every step, with
    and without banned tokens. Gemma-3's 262,144-token vocabulary is where the preselection is used."""
    llama.preload_native()
    small = sampling.Sampler(_sampled(), 49_152)
    assert not small.preselect  # SmolLM2's size: the chain's own top-k is as fast
    small.free()
    out = _shortcut_agrees(gemma_path, _sampled, "preselect", "Once upon a time, in a village by the sea,", 48)
    assert len(set(out)) > 10  # sampled text, not a loop

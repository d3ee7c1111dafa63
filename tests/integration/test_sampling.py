"""The sampling shortcuts against llama.cpp's own sampler chain, in process on the real models (the
greedy argmax; a sampled request's top-k preselection): the same token every step, with and without
banned tokens (``ignore_eos``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrad.engine import llama
from hydrad.common.params import RuntimeParams


def _greedy(ban: tuple[int, ...] = ()) -> llama.Sampling:
    return llama.Sampling(temperature=0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                          frequency_penalty=0, presence_penalty=0, seed=1, ban=ban)


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_argmax_picks_what_the_greedy_chain_picks(which: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(f"{which}_path")
    llama.preload_native()
    params = RuntimeParams(n_gpu_layers=0, n_ctx=512, n_parallel=1, n_threads=2)
    model = llama.Model.load(path, params)
    ctx = llama.Context(model, params)
    batch = llama.Batch(512)
    try:
        eog = tuple(model.eog_tokens())
        fast, chain = llama.Sampler(_greedy(), model.n_vocab), llama.Sampler(_greedy(), 0)
        fast_ban, chain_ban = llama.Sampler(_greedy(eog), model.n_vocab), llama.Sampler(_greedy(eog), 0)
        assert fast.argmax and fast_ban.argmax and not chain.argmax and not chain_ban.argmax
        tokens = model.tokenize("The three primary colours are", True, False)
        batch.clear()
        idx = batch.add_run(tokens, 0, 0, True)
        out: list[int] = []
        for step in range(24):
            assert batch.decode(ctx) == 0
            # the banned pair first: the argmax writes -inf into the row it reads
            want_ban = chain_ban.sample(ctx, idx)
            want = chain.sample(ctx, idx)
            got = fast.sample(ctx, idx)
            assert got == want, (step, got, want)
            assert fast_ban.sample(ctx, idx) == want_ban and want_ban not in eog
            out.append(got)
            batch.clear()
            idx = batch.add(got, len(tokens) + step, 0, True)
        assert len(set(out)) > 3  # a real continuation, not one token repeated
    finally:
        for s in (fast, chain, fast_ban, chain_ban):
            s.free()
        batch.free()
        ctx.free()
        model.free()


def _sampled(ban: tuple[int, ...] = (), seed: int = 7) -> llama.Sampling:
    return llama.Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                          frequency_penalty=0, presence_penalty=0, seed=seed, ban=ban)


def test_top_k_preselection_samples_what_the_full_chain_samples(gemma_path: Path) -> None:
    """A sampled request's chain run on the row's top-k candidates (found with numpy) against the same
    chain over all n_vocab logits (llama_sampler_sample), same seed: the same token every step, with
    and without banned tokens. Gemma-3's 262,144-token vocabulary is where the preselection is used."""
    path = gemma_path
    llama.preload_native()
    params = RuntimeParams(n_gpu_layers=0, n_ctx=512, n_parallel=1, n_threads=2)
    model = llama.Model.load(path, params)
    ctx = llama.Context(model, params)
    batch = llama.Batch(512)
    try:
        small = llama.Sampler(_sampled(), 49_152)
        assert not small.preselect  # SmolLM2's size: the chain's own top-k is as fast
        small.free()
        eog = tuple(model.eog_tokens())
        fast, chain = llama.Sampler(_sampled(), model.n_vocab), llama.Sampler(_sampled(), 0)
        fast_ban, chain_ban = llama.Sampler(_sampled(eog, 9), model.n_vocab), llama.Sampler(_sampled(eog, 9), 0)
        assert fast.preselect and fast_ban.preselect and not chain.preselect and not chain_ban.preselect
        tokens = model.tokenize("Once upon a time, in a village by the sea,", True, False)
        batch.clear()
        idx = batch.add_run(tokens, 0, 0, True)
        out: list[int] = []
        for step in range(48):
            assert batch.decode(ctx) == 0
            want = chain.sample(ctx, idx)
            got = fast.sample(ctx, idx)
            assert got == want, (step, got, want)
            want_ban = chain_ban.sample(ctx, idx)  # before the fast one writes -inf into the row
            assert fast_ban.sample(ctx, idx) == want_ban and want_ban not in eog
            out.append(got)
            batch.clear()
            idx = batch.add(got, len(tokens) + step, 0, True)
        assert len(set(out)) > 10  # sampled text, not a loop
    finally:
        for s in (fast, chain, fast_ban, chain_ban):
            s.free()
        batch.free()
        ctx.free()
        model.free()

"""CPU threads a load takes from the generation serving beside it (``load_threads``).

A context's CPU thread pool waits at the end of every step for its slowest thread; when the pool is
as wide as the machine, a loader thread beside it takes a core from one of the pool's threads and whole
steps wait. The serving contexts lend ``load_threads`` threads while a load runs and get them back
after it, whichever way it ends. These tests read the thread counts back from llama.cpp itself
(``llama_n_threads``), on real contexts of SmolLM2."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.engine import llama
from hydrad.engine.core import EngineCore
from hydrad.engine.generation import Generation, build_generation
from hydrad.engine.gpu import PAGEABLE_BESIDE
from hydrad.engine.loader import LoadRecord

pytestmark = pytest.mark.model

PARAMS = RuntimeParams(n_ctx=512, n_parallel=1, n_threads=3, n_threads_batch=4)


def _in_llama(ctx: llama.Context) -> tuple[int, int]:
    C = llama.lib()
    return C.llama_n_threads(ctx.ptr), C.llama_n_threads_batch(ctx.ptr)


def _generation(path: Path, warm_threads: int = 0) -> Generation:
    resolved = ResolvedModel(alias="smollm2-135m", path=path, entry=None)
    return build_generation(resolved, PARAMS, lambda _v: True, 1, on_warming=lambda: None, warm_threads=warm_threads)


def test_a_context_lends_threads_down_to_one_and_takes_them_back(smollm_path: Path) -> None:
    gen = _generation(smollm_path)
    try:
        ctx = gen.ctx
        assert ctx.threads == (3, 4) and _in_llama(ctx) == (3, 4)
        ctx.share_cpu(1)
        assert ctx.threads_now == (2, 3) and _in_llama(ctx) == (2, 3)
        ctx.share_cpu(10)  # never fewer than one
        assert _in_llama(ctx) == (1, 1)
        ctx.share_cpu(0)
        assert _in_llama(ctx) == (3, 4)
        ctx.limit_threads(2)
        assert _in_llama(ctx) == (2, 2)
        ctx.limit_threads(0)
        assert _in_llama(ctx) == (3, 4)
    finally:
        gen.free()


def test_a_new_generation_warms_up_on_the_lent_threads(smollm_path: Path) -> None:
    gen = _generation(smollm_path, warm_threads=1)
    try:
        assert _in_llama(gen.ctx) == (1, 1)  # until the engine thread installs it
    finally:
        gen.free()


def test_the_engine_lends_while_a_load_runs_and_takes_back_however_it_ends(smollm_path: Path) -> None:
    core = EngineCore(load_threads=2)
    serving, retiring = _generation(smollm_path), _generation(smollm_path)
    core.loader.gen, core.loader.retiring = serving, [retiring]
    try:
        core._share_cpu()
        assert _in_llama(serving.ctx) == (3, 4)  # no load: their own
        rec = LoadRecord(7, "gemma3-270m")
        core.loader.current_load = rec
        core._share_cpu()
        assert _in_llama(serving.ctx) == (3, 4), "a queued load has not started taking CPU yet"
        for phase in ("loading", "warming"):
            rec.phase = phase
            core._share_cpu()
            assert _in_llama(serving.ctx) == (1, 2), phase
            assert _in_llama(retiring.ctx) == (1, 2), phase
        for ending in ("installing", "failed", "aborted", "done"):
            rec.phase = "loading"
            core._share_cpu()
            rec.phase = ending
            core._share_cpu()
            assert _in_llama(serving.ctx) == (3, 4), ending
            assert _in_llama(retiring.ctx) == (3, 4), ending
        rec.phase = "loading"
        core._share_cpu()
        core.loader.current_load = None  # the loader thread clears it when a load ends
        core._share_cpu()
        assert _in_llama(serving.ctx) == (3, 4)
    finally:
        core.loader.gen, core.loader.retiring = None, []
        serving.free()
        retiring.free()


def test_an_installed_generation_gets_its_own_threads_back(smollm_path: Path) -> None:
    core = EngineCore(load_threads=1)
    new = _generation(smollm_path, warm_threads=1)
    core.loader.gen = new
    try:
        core._share_cpu()  # the engine thread's first turn after the install
        assert _in_llama(new.ctx) == (3, 4)
    finally:
        core.loader.gen = None
        new.free()


def test_no_sharing_when_load_threads_is_zero(smollm_path: Path) -> None:
    core = EngineCore(load_threads=0)
    serving = _generation(smollm_path)
    core.loader.gen, core.loader.current_load = serving, LoadRecord(1, "gemma3-270m", phase="loading")
    try:
        core._share_cpu()
        assert _in_llama(serving.ctx) == (3, 4)
    finally:
        core.loader.gen, core.loader.current_load = None, None
        serving.free()


def test_an_embedding_context_lends_too(smollm_path: Path) -> None:
    params = PARAMS.model_copy(update={"embeddings": True})
    resolved = ResolvedModel(alias="smollm2-135m", path=smollm_path, entry=None)
    gen = build_generation(resolved, params, lambda _v: True, 1, on_warming=lambda: None)
    core = EngineCore(load_threads=1)
    core.loader.gen, core.loader.current_load = gen, LoadRecord(2, "gemma3-270m", phase="warming")
    try:
        assert gen.embedder is not None
        core._share_cpu()
        assert _in_llama(gen.embedder.ctx) == (2, 3) and _in_llama(gen.ctx) == (2, 3)
        core.loader.current_load = None
        core._share_cpu()
        assert _in_llama(gen.embedder.ctx) == (3, 4)
    finally:
        core.loader.gen, core.loader.current_load = None, None
        gen.free()


@pytest.mark.parametrize("beside", [True, False])
def test_an_armed_engine_creates_and_warms_a_context_beside_serving_with_pageable_host_buffers(
        smollm_path: Path, beside: bool) -> None:
    """``cuda_pinned_host: alone``: the window is open while the contexts are made and warmed up, and
    only for a load beside a serving generation (no CUDA here: what is read is what ggml reads)."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    PAGEABLE_BESIDE.arm()
    seen: list[bytes | None] = []
    resolved = ResolvedModel(alias="smollm2-135m", path=smollm_path, entry=None)
    gen = build_generation(resolved, PARAMS, lambda _v: seen.append(libc.getenv(b"GGML_CUDA_NO_PINNED")) or True, 1,
                           on_warming=lambda: seen.append(libc.getenv(b"GGML_CUDA_NO_PINNED")), beside=beside)
    gen.free()
    assert seen[0] is None  # the model's own load (its staging) keeps page-locked memory
    assert seen[-1] == (b"1" if beside else None)
    assert libc.getenv(b"GGML_CUDA_NO_PINNED") is None

"""The engine's settings reach llama.cpp's parameter structs.

A ctypes ``Structure`` takes any attribute without complaint, so a field llama.cpp renamed (``use_mmap``
became ``load_mode``) made the engine's assignment a silent no-op: ``use_mmap: false`` loaded by mapping
the file all the same. The first test names every field the wrapper sets against the structs' own
fields; the second reads back, from llama.cpp's own log, how a real load read the model."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.engine import llama

STRUCTS = {"mp": "llama_model_params", "cp": "llama_context_params"}


def test_every_field_the_wrapper_sets_is_a_field_of_the_struct() -> None:
    tree = ast.parse(Path(llama.__file__).read_text())
    set_fields: dict[str, set[str]] = {name: set() for name in STRUCTS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id in STRUCTS:
                    set_fields[target.value.id].add(target.attr)
    C = llama.lib()
    for var, struct in STRUCTS.items():
        known = {f[0] for f in getattr(C, struct)._fields_}
        assert set_fields[var], f"the wrapper sets no field of {struct}: the scan is broken"
        assert set_fields[var] <= known, f"not fields of {struct}: {sorted(set_fields[var] - known)}"


@pytest.mark.model
@pytest.mark.parametrize("use_mmap, mode", [(True, "mmap"), (False, "none")])
def test_use_mmap_decides_how_llama_cpp_reads_the_model(smollm_path: Path, use_mmap: bool, mode: str,
                                                        caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    llama.lib()
    monkeypatch.setattr(llama, "_llama_log_min", llama._LOG_LEVELS["info"])
    with caplog.at_level(logging.INFO, logger="hydrad.llama"):
        llama.Model.load(smollm_path, RuntimeParams(use_mmap=use_mmap)).free()
    said = [r.getMessage() for r in caplog.records if "load_mode =" in r.getMessage()]
    assert said and said[-1].endswith(f"(load_mode = {mode})"), said


@pytest.mark.model
@pytest.mark.parametrize("no_host", [False, True])
def test_no_host_reaches_the_model_params_of_a_real_load(smollm_path: Path, no_host: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU-only build llama.cpp has no GPU host buffer to bypass, so what can be checked here is that
    the struct llama.cpp loads with carries the setting; a GPU run shows its effect (docs/benchmarks.md)."""
    C = llama.lib()
    real = C.llama_model_load_from_file
    seen: list[bool] = []

    def spy(path: bytes, mp: object) -> object:
        seen.append(bool(getattr(mp, "no_host")))  # noqa: B009 (mp: the ctypes struct, typed object)
        return real(path, mp)

    monkeypatch.setattr(C, "llama_model_load_from_file", spy)
    llama.Model.load(smollm_path, RuntimeParams(no_host=no_host)).free()
    assert seen == [no_host]


CONTEXT = RuntimeParams(n_ctx=512, n_batch=256, n_ubatch=128, n_parallel=2, kv_unified=False, cache_type_k="q8_0",
                        cache_type_v="f16", flash_attn="off", rope_scaling="yarn", rope_freq_base=20000.0,
                        rope_freq_scale=0.5, yarn_ext_factor=0.25, yarn_attn_factor=0.75, yarn_beta_fast=16.0,
                        yarn_beta_slow=2.0, yarn_orig_ctx=1024, n_threads=1, n_threads_batch=2,
                        split_mode="none")


@pytest.mark.model
def test_context_parameters_reach_a_real_context(smollm_path: Path, caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every T2 parameter is in the struct llama.cpp builds the context from, and llama.cpp's own log of
    the context it built says it used those it reports (slots, batches, attention, KV layout and types,
    RoPE)."""
    C = llama.lib()
    real_ctx, real_model = C.llama_init_from_model, C.llama_model_load_from_file
    seen: dict[str, object] = {}

    def ctx_spy(model: object, cp: object) -> object:
        seen.update({f: getattr(cp, f) for f in ("rope_scaling_type", "yarn_ext_factor", "yarn_attn_factor",
                                                 "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "n_threads",
                                                 "n_threads_batch")})
        return real_ctx(model, cp)

    def model_spy(path: bytes, mp: object) -> object:
        seen.update(split_mode=getattr(mp, "split_mode"))  # noqa: B009
        return real_model(path, mp)

    monkeypatch.setattr(C, "llama_init_from_model", ctx_spy)
    monkeypatch.setattr(C, "llama_model_load_from_file", model_spy)
    monkeypatch.setattr(llama, "_llama_log_min", llama._LOG_LEVELS["info"])
    with caplog.at_level(logging.INFO, logger="hydrad.llama"):
        model = llama.Model.load(smollm_path, CONTEXT)
        ctx = llama.Context(model, CONTEXT)
    said = "\n".join(r.getMessage() for r in caplog.records)
    for line in ("n_seq_max             = 2", "n_batch               = 256", "n_ubatch              = 128",
                 "flash_attn            = disabled", "kv_unified            = false",
                 "freq_base             = 20000.0", "freq_scale            = 0.5", "K (q8_0)", "V (f16)"):
        assert line in said, line
    assert seen == {"rope_scaling_type": 2, "yarn_ext_factor": 0.25, "yarn_attn_factor": 0.75, "yarn_beta_fast": 16.0,
                    "yarn_beta_slow": 2.0, "yarn_orig_ctx": 1024, "n_threads": 1, "n_threads_batch": 2,
                    "split_mode": 0}
    assert ctx.n_ctx == 512 and ctx.n_seq == 2
    ctx.free()
    model.free()

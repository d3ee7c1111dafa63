"""Tiny LoRA adapters and control vectors for a real model, written with the ``gguf`` package inside a
test (no adapter file of SmolLM2 exists to download, and one made here has known contents).

A LoRA adapter is what llama.cpp's ``llama_adapter_lora_init`` reads (src/llama-adapter.cpp):
``general.type = adapter``, ``general.architecture`` the base model's, ``adapter.type = lora``,
``adapter.lora.alpha``, and for each adapted weight ``W`` (``ne = [n_in, n_out]``) a pair
``W.lora_a`` (``ne = [n_in, r]``) and ``W.lora_b`` (``ne = [r, n_out]``); llama.cpp adds
``scale * alpha / r * B(A x)`` to ``W x``. A control vector is what llama-server's loader reads:
one ``direction.<layer>`` tensor of ``n_embd`` floats per layer (from 1), added to that layer's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _gguf() -> Any:
    import pytest

    return pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")


def make_lora(out: Path, n_embd: int, n_layer: int, rank: int = 8, alpha: float = 8.0, arch: str = "llama",
              seed: int = 0, spread: float = 0.5, tensors: tuple[str, ...] = ("attn_q",)) -> Path:
    """A LoRA on ``tensors`` (square n_embd × n_embd weights) of every layer, random weights of ``spread``
    (large enough that greedy output changes visibly at scale 1, small enough that it stays text-like)."""
    gguf = _gguf()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for il in range(n_layer):
        for name in tensors:
            a = rng.normal(0, spread / np.sqrt(n_embd), size=(rank, n_embd)).astype(np.float32)  # ne [n_in, r]
            b = rng.normal(0, spread, size=(n_embd, rank)).astype(np.float32)  # ne [r, n_out]
            w.add_tensor(f"blk.{il}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{il}.{name}.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def make_control_vector(out: Path, n_embd: int, layers: range, seed: int = 0, spread: float = 1.0) -> Path:
    """A control vector: ``direction.<il>`` for each layer of ``layers`` (from 1), random of ``spread``."""
    gguf = _gguf()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_int32("controlvector.layer_count", len(layers))
    for il in layers:
        w.add_tensor(f"direction.{il}", rng.normal(0, spread, size=(n_embd,)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

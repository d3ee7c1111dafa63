#!/usr/bin/env python3
"""Write a tiny Mixture-of-Experts GGUF with random weights, for tests and benchmarks of expert placement.

The models Hydra tests with (SmolLM2-135M, Gemma-3-270M) are dense: they have no expert tensors, so
nothing that puts experts on another device (llama.cpp's tensor buffer type overrides, e.g.
``blk\\.\\d+\\.ffn_.*_exps\\.=CPU``) can be exercised with them, and real MoE GGUFs are gigabytes. This
script writes one of a few MB that the bundled llama.cpp loads and runs:

* architecture ``llama`` in the Mixtral layout: per layer ``ffn_gate_inp`` (the router) and the 3-D
  expert tensors ``blk.N.ffn_gate_exps.weight``, ``blk.N.ffn_up_exps.weight`` and
  ``blk.N.ffn_down_exps.weight`` (one slice per expert), with ``llama.expert_count`` and
  ``llama.expert_used_count`` set;
* the tokenizer (every ``tokenizer.*`` key: model, pre, tokens, token types, scores, merges,
  special token ids, chat template) copied from a real GGUF, SmolLM2-135M-Instruct by default (in
  $HYDRA_MODELS_DIR, else models/), so that prompts tokenize as they would for that model;
  ``token_embd`` has that vocabulary's size and is tied to the output (no ``output.weight``);
* f16 weights (f32 norms) drawn from a normal distribution scaled by 1/sqrt(fan-in), the same for
  the same ``--seed``, so the file, and a greedy completion with it, is reproducible.

The text it writes is noise, but every step of a real MoE forward pass runs (routing, top-k
experts, their matmuls), which is what placement tests and benchmarks need.

Usage::

    .venv/bin/python scripts/make_tiny_moe.py models/tiny-moe.gguf
    .venv/bin/python scripts/make_tiny_moe.py /tmp/moe.gguf --layers 8 --experts 8 --experts-used 2 \\
        --embd 128 --ff 256 --seed 1 --vocab-from models/SmolLM2-135M-Instruct.Q4_1.gguf

With the defaults (4 layers, 4 experts of which 2 are used, n_embd 64, n_ff 128) the file is about
9 MB: 6.3 MB is the 49152 × 64 token embedding, 2 MB the vocabulary, 0.8 MB the experts. Most of
the writing time (about 5 s on a busy 2-core machine) is spent reading the vocabulary from the source
GGUF with gguf.GGUFReader.
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VOCAB = Path(os.environ.get("HYDRA_MODELS_DIR", REPO / "models")) / "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCH = "llama"


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        sys.exit("make_tiny_moe: the gguf package is missing (.venv/bin/pip install gguf, or scripts/setup)")
    return gguf


def read_tokenizer(path: Path) -> list[tuple[str, Any, Any, Any]]:
    """Every ``tokenizer.*`` key of ``path`` as (key, value, type, array element type)."""
    gguf = _gguf()
    reader = gguf.GGUFReader(path)
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in out):
        sys.exit(f"make_tiny_moe: {path} has no tokenizer.ggml.tokens; pick another --vocab-from")
    return out


def llama_writer(path: Path, name: str, tokenizer: list[tuple[str, Any, Any, Any]], *, ctx: int, embd: int, ff: int,
                 layers: int, heads: int, heads_kv: int, rope_base: float, arch: str = ARCH) -> Any:
    """A GGUFWriter for an F16 ``llama`` model of these shapes with ``tokenizer``'s keys (from
    :func:`read_tokenizer`), its metadata added; the caller adds its own keys and the tensors. ``arch``:
    another architecture of llama's tensors and keys (``qwen2vl``: its keys under that name)."""
    gguf = _gguf()
    n_vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(ctx)
    writer.add_embedding_length(embd)
    writer.add_feed_forward_length(ff)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads_kv)
    writer.add_rope_dimension_count(embd // heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    for key, value, vtype, sub in tokenizer:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    return writer


def make(out: Path, vocab_from: Path, *, layers: int = 4, experts: int = 4, experts_used: int = 2,
         embd: int = 64, ff: int = 128, heads: int = 4, heads_kv: int = 2, seed: int = 0) -> dict[str, Any]:
    """Write the GGUF; return a summary (vocab size, tensor count, bytes)."""
    _gguf()  # the package missing is said before any work
    if not vocab_from.is_file():
        sys.exit(f"make_tiny_moe: vocabulary source {vocab_from} not found "
                 "(scripts/setup fetches the default models, or pass --vocab-from GGUF)")
    if not 1 <= experts_used <= experts:
        sys.exit(f"make_tiny_moe: --experts-used must be between 1 and --experts ({experts}), not {experts_used}")
    if layers < 1 or embd < 1 or ff < 1:
        sys.exit("make_tiny_moe: --layers, --embd and --ff must be positive")
    if embd % heads or heads % heads_kv:
        sys.exit(f"make_tiny_moe: --embd ({embd}) must be a multiple of {heads} heads")
    head_dim = embd // heads
    if head_dim % 2:
        sys.exit(f"make_tiny_moe: --embd / {heads} heads must be even (RoPE), not {head_dim}")

    tokenizer = read_tokenizer(vocab_from)
    n_vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        """A weight of numpy shape ``shape`` (GGUF's ne reversed), scaled by 1/sqrt(fan-in)."""
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(embd, dtype=np.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")  # renamed at the end: no half-written OUT
    # no seed in the name: seeds differ in weights only
    writer = llama_writer(tmp, f"tiny-moe-{layers}x{experts}e{experts_used}", tokenizer, ctx=4096, embd=embd, ff=ff,
                          layers=layers, heads=heads, heads_kv=heads_kv, rope_base=10000.0)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(experts_used)

    kv = head_dim * heads_kv
    # token_embd: ne [embd, vocab]; tied to the output (llama.cpp uses it when output.weight is absent)
    writer.add_tensor("token_embd.weight", w(n_vocab, embd))
    writer.add_tensor("output_norm.weight", norm())
    for i in range(layers):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", norm())
        writer.add_tensor(f"{b}.attn_q.weight", w(embd, embd))
        writer.add_tensor(f"{b}.attn_k.weight", w(kv, embd))
        writer.add_tensor(f"{b}.attn_v.weight", w(kv, embd))
        writer.add_tensor(f"{b}.attn_output.weight", w(embd, embd))
        writer.add_tensor(f"{b}.ffn_norm.weight", norm())
        # router: ne [embd, experts], kept f32 like convert_hf_to_gguf does
        writer.add_tensor(f"{b}.ffn_gate_inp.weight", w(experts, embd).astype(np.float32))
        # experts: ne [embd, ff, experts] for gate and up, [ff, embd, experts] for down
        writer.add_tensor(f"{b}.ffn_gate_exps.weight", w(experts, ff, embd))
        writer.add_tensor(f"{b}.ffn_up_exps.weight", w(experts, ff, embd))
        writer.add_tensor(f"{b}.ffn_down_exps.weight", w(experts, embd, ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return {"vocab": n_vocab, "tensors": 2 + 9 * layers, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", type=Path, help="the GGUF to write")
    p.add_argument("--vocab-from", type=Path, default=DEFAULT_VOCAB,
                   help="GGUF whose tokenizer is copied")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks, each with its own experts")
    p.add_argument("--experts", type=int, default=4, help="experts per layer (llama.expert_count)")
    p.add_argument("--experts-used", type=int, default=2, help="experts per token (llama.expert_used_count)")
    p.add_argument("--embd", type=int, default=64, help="n_embd (a multiple of 4 attention heads)")
    p.add_argument("--ff", type=int, default=128, help="n_ff of each expert")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    s = make(a.out, a.vocab_from, layers=a.layers, experts=a.experts, experts_used=a.experts_used,
             embd=a.embd, ff=a.ff, seed=a.seed)
    print(f"wrote {a.out}: {ARCH}, {a.layers} layers, {a.experts} experts ({a.experts_used} used), "
          f"n_embd {a.embd}, n_ff {a.ff}, vocab {s['vocab']}, {s['tensors']} tensors, "
          f"{s['bytes'] / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

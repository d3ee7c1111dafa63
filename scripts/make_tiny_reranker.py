#!/usr/bin/env python3
"""Write a tiny reranker GGUF with random weights, for tests of reranking (``/rerank``).

A reranker scores a (query, document) pair with a classification head on the model's last hidden state,
which llama.cpp reads through its ``rank`` pooling; the models Hydra tests with (SmolLM2-135M,
Gemma-3-270M) have none, and real rerankers are hundreds of megabytes. This writes one of a few MB in the
layout of a Qwen3 reranker, which the bundled llama.cpp loads with rank pooling:

* architecture ``qwen3`` (llama's tensors plus per-layer ``attn_q_norm``/``attn_k_norm``), causal, so
  rank pooling reads the last token of each input;
* ``qwen3.pooling_type`` = rank and ``qwen3.classifier.output_labels`` = ["yes", "no"] (two classes; a
  Qwen3 reranker's head ends in a softmax, so the score, the first class's, lies in (0, 1)), and the
  head itself, ``cls.output.weight`` (ne [n_embd, 2]);
* the tokenizer (every ``tokenizer.*`` key) copied from a real GGUF, SmolLM2-135M-Instruct by default, and
  with ``--rerank-template`` llama.cpp's ``tokenizer.chat_template.rerank``, the prompt a query and a
  document are put in (``{query}`` and ``{document}`` replaced); without it llama-server's other form,
  the query's tokens, then the document's, with the BOS, EOS and SEP tokens the vocabulary adds;
* f16 weights (f32 norms) drawn from a normal distribution scaled by 1/sqrt(fan-in), the same for the
  same ``--seed``: the scores are noise, but the same noise every time, and every step of a reranking
  pass runs.

Usage::

    .venv/bin/python scripts/make_tiny_reranker.py /tmp/rerank.gguf
    .venv/bin/python scripts/make_tiny_reranker.py /tmp/rerank.gguf --rerank-template \\
        '<|im_start|>query: {query}\\ndocument: {document}<|im_end|>'
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_moe import DEFAULT_VOCAB, _gguf, llama_writer, read_tokenizer  # noqa: E402 (after the path)

LABELS = ["yes", "no"]


def make(out: Path, vocab_from: Path, *, layers: int = 2, embd: int = 64, ff: int = 128, heads: int = 4,
         heads_kv: int = 2, seed: int = 0, rerank_template: str | None = None,
         tokenizer: list[tuple[str, Any, Any, Any]] | None = None) -> dict[str, Any]:
    """Write the GGUF; return a summary (vocab size, bytes). ``tokenizer``: one already read from
    ``vocab_from`` (:func:`make_tiny_moe.read_tokenizer`), to write several models from one read."""
    gguf = _gguf()
    if tokenizer is None:
        if not vocab_from.is_file():
            sys.exit(f"make_tiny_reranker: vocabulary source {vocab_from} not found "
                     "(scripts/setup fetches the default models, or pass --vocab-from GGUF)")
        tokenizer = read_tokenizer(vocab_from)
    n_vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    head_dim = embd // heads
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer = llama_writer(tmp, f"tiny-reranker-{layers}", tokenizer, ctx=4096, embd=embd, ff=ff, layers=layers,
                          heads=heads, heads_kv=heads_kv, rope_base=10000.0, arch="qwen3")
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(LABELS)
    if rerank_template is not None:
        writer.add_string("tokenizer.chat_template.rerank", rerank_template)
    kv = head_dim * heads_kv
    writer.add_tensor("token_embd.weight", w(n_vocab, embd))
    writer.add_tensor("output_norm.weight", ones(embd))
    writer.add_tensor("cls.output.weight", w(len(LABELS), embd))
    for i in range(layers):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", ones(embd))
        writer.add_tensor(f"{b}.attn_q.weight", w(embd, embd))
        writer.add_tensor(f"{b}.attn_k.weight", w(kv, embd))
        writer.add_tensor(f"{b}.attn_v.weight", w(kv, embd))
        writer.add_tensor(f"{b}.attn_output.weight", w(embd, embd))
        writer.add_tensor(f"{b}.attn_q_norm.weight", ones(head_dim))
        writer.add_tensor(f"{b}.attn_k_norm.weight", ones(head_dim))
        writer.add_tensor(f"{b}.ffn_norm.weight", ones(embd))
        writer.add_tensor(f"{b}.ffn_gate.weight", w(ff, embd))
        writer.add_tensor(f"{b}.ffn_up.weight", w(ff, embd))
        writer.add_tensor(f"{b}.ffn_down.weight", w(embd, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return {"vocab": n_vocab, "bytes": out.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", type=Path, help="the GGUF to write")
    p.add_argument("--vocab-from", type=Path, default=DEFAULT_VOCAB, help="GGUF whose tokenizer is copied")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--embd", type=int, default=64, help="n_embd (a multiple of 4 attention heads)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--rerank-template", default=None,
                   help="tokenizer.chat_template.rerank: the prompt with {query} and {document} in it")
    a = p.parse_args(argv)
    s = make(a.out, a.vocab_from, layers=a.layers, embd=a.embd, seed=a.seed, rerank_template=a.rerank_template)
    print(f"wrote {a.out}: qwen3 reranker, {a.layers} layers, n_embd {a.embd}, vocab {s['vocab']}, "
          f"{s['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Write a dense random-weight GGUF of a chosen size and quantize it, for speed benchmarks on a GPU.

The two default models (135M and 270M parameters) are so small that a GPU step is bound by kernel
launches, far from the memory-bandwidth limit where real 1–8B models live. Real GGUFs of that size
are gigabytes that cannot travel to an offline benchmark host; this script makes one there instead.

Speed does not depend on the weights' values: every matmul, attention and sampling step runs on the
same shapes and types whatever the numbers are (the text the model writes is noise). So a random
model of a real architecture's shapes measures what a real model of those shapes would.

* architecture ``llama`` (Llama-3-like shapes per ``--size``: 1b, 3b, 8b; or explicit ``--layers``,
  ``--embd``, ``--ff``, ``--heads``, ``--heads-kv``), untied output;
* the tokenizer of a real GGUF (SmolLM2-135M's by default: 49,152 tokens), so prompts tokenize as for
  that model and the benchmark's exact-token prompts work;
* F16 weights written tensor by tensor (memory stays at one tensor, not the whole model), drawn once
  from a normal distribution and reused with an offset per tensor (drawing billions of normals would
  take longer than the rest), scaled by 1/sqrt(fan-in) so activations stay finite;
* then ``--quant`` (default ``Q4_K_M,Q8_0``) files beside it made by the bundled llama.cpp's own
  quantizer (``llama_model_quantize``, as ``llama-quantize`` does).

Usage::

    .venv/bin/python scripts/make_model.py models/rand-3b --size 3b          # F16 + Q4_K_M + Q8_0
    .venv/bin/python scripts/make_model.py /tmp/rand --layers 2 --embd 256 --ff 512 --quant Q8_0

It prints the files written, one per line, last the summary. On the GPU host the 3B F16 file takes
about a minute to write and each quantization about half a minute (16 cores).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as scripts/NAME: under the checkout's .venv when there is one
    import _venv
    _venv.reexec()

import argparse
import ctypes
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from hydrad.common.cpus import usable_cpus  # noqa: E402
from make_tiny_moe import DEFAULT_VOCAB, _gguf, llama_writer, read_tokenizer  # noqa: E402

# (layers, n_embd, n_ff, heads, kv heads): the shapes of Llama-3.2-1B/3B and Llama-3.1-8B.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "1b": (16, 2048, 8192, 32, 8),
    "3b": (28, 3072, 8192, 24, 8),
    "8b": (32, 4096, 14336, 32, 8),
}
# llama_ftype values of llama.h for the quantizations offered.
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def make_f16(out: Path, vocab_from: Path, *, layers: int, embd: int, ff: int, heads: int, heads_kv: int,
             seed: int = 0) -> dict[str, Any]:
    """Write the F16 GGUF tensor by tensor; return a summary (parameters, bytes)."""
    _gguf()  # the package missing is said before any work
    if not vocab_from.is_file():
        sys.exit(f"make_model: vocabulary source {vocab_from} not found "
                 "(scripts/setup fetches the default models, or pass --vocab-from GGUF)")
    if min(layers, embd, ff, heads, heads_kv) < 1 or embd % heads or heads % heads_kv or (embd // heads) % 2:
        sys.exit(f"make_model: shapes do not fit: n_embd {embd} must split into {heads} heads of even size, "
                 f"and {heads} heads into {heads_kv} KV groups")
    tokenizer = read_tokenizer(vocab_from)
    n_vocab = len(next(v for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"))
    head_dim = embd // heads
    kv = head_dim * heads_kv

    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, embd)),
                                                 ("output_norm.weight", (embd,)),
                                                 ("output.weight", (n_vocab, embd))]
    for i in range(layers):
        b = f"blk.{i}"
        shapes += [(f"{b}.attn_norm.weight", (embd,)), (f"{b}.attn_q.weight", (embd, embd)),
                   (f"{b}.attn_k.weight", (kv, embd)), (f"{b}.attn_v.weight", (kv, embd)),
                   (f"{b}.attn_output.weight", (embd, embd)), (f"{b}.ffn_norm.weight", (embd,)),
                   (f"{b}.ffn_gate.weight", (ff, embd)), (f"{b}.ffn_up.weight", (ff, embd)),
                   (f"{b}.ffn_down.weight", (embd, ff))]
    largest = max(int(np.prod(s)) for _, s in shapes)
    pool = np.random.default_rng(seed).standard_normal(largest + 7919, dtype=np.float32).astype(np.float16)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")  # renamed at the end: no half-written OUT
    writer = llama_writer(tmp, f"random-llama-{layers}x{embd}", tokenizer, ctx=131072, embd=embd, ff=ff,
                          layers=layers, heads=heads, heads_kv=heads_kv, rope_base=500000.0)
    for name, shape in shapes:
        dtype = np.float32 if len(shape) == 1 else np.float16
        writer.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    params = 0
    for i, (_name, shape) in enumerate(shapes):
        n = int(np.prod(shape))
        params += n
        if len(shape) == 1:
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        off = (i * 7919) % (pool.size - n + 1)
        writer.write_tensor_data((pool[off:off + n] * np.float16(1 / np.sqrt(shape[-1]))).reshape(shape))
    writer.close()
    tmp.replace(out)
    return {"params": params, "bytes": out.stat().st_size, "vocab": n_vocab}


def quantize(src: Path, out: Path, quant: str, threads: int) -> Path:
    """``src`` → ``out`` with llama.cpp's quantizer (the library llama-cpp-python loads)."""
    from hydrad.engine import llama

    C = llama.lib()
    qp = C.llama_model_quantize_default_params()
    qp.ftype = FTYPES[quant]
    qp.nthread = threads
    tmp = out.with_name(out.name + ".tmp")
    rc = C.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(qp))
    if rc != 0 or not tmp.is_file():
        sys.exit(f"make_model: llama_model_quantize({src} -> {quant}) failed with {rc}")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", type=Path, help="file stem: writes STEM.F16.gguf and STEM.QUANT.gguf per --quant")
    p.add_argument("--size", choices=sorted(SIZES), help="Llama-3-like shapes; the explicit options override")
    p.add_argument("--layers", type=int, help="transformer blocks")
    p.add_argument("--embd", type=int, help="n_embd")
    p.add_argument("--ff", type=int, help="n_ff")
    p.add_argument("--heads", type=int, help="attention heads")
    p.add_argument("--heads-kv", type=int, help="KV heads (grouped-query attention)")
    p.add_argument("--quant", default="Q4_K_M,Q8_0",
                   help=f"comma-separated quantizations to make from the F16 file ({', '.join(FTYPES)}); '' for none")
    p.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    p.add_argument("--threads", type=int, default=usable_cpus(),
                   help="quantizer threads (default: the CPUs this process may use, quota and affinity included)")
    p.add_argument("--vocab-from", type=Path, default=DEFAULT_VOCAB, help="GGUF whose tokenizer is copied")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    a = p.parse_args(argv)
    base = SIZES.get(a.size or "", (None,) * 5)
    dims = [given if given is not None else default
            for given, default in zip((a.layers, a.embd, a.ff, a.heads, a.heads_kv), base)]
    if any(d is None for d in dims):
        p.error("give --size or all of --layers --embd --ff --heads --heads-kv")
    quants = [q for q in a.quant.split(",") if q]
    unknown = [q for q in quants if q not in FTYPES]
    if unknown:
        p.error(f"--quant: unknown {', '.join(unknown)}; choose from {', '.join(FTYPES)}")
    layers, embd, ff, heads, heads_kv = dims
    f16 = a.out.with_name(a.out.name + ".F16.gguf")
    t0 = time.monotonic()
    s = make_f16(f16, a.vocab_from, layers=layers, embd=embd, ff=ff, heads=heads, heads_kv=heads_kv, seed=a.seed)
    t_f16 = time.monotonic() - t0
    print(f16)
    made = []
    for q in quants:
        t = time.monotonic()
        out = quantize(f16, a.out.with_name(f"{a.out.name}.{q}.gguf"), q, a.threads)
        made.append(f"{q} {out.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t:.0f} s")
        print(out)
    if quants and not a.keep_f16:
        f16.unlink()
    print(f"make_model: llama {layers} layers, n_embd {embd}, n_ff {ff}, {heads}/{heads_kv} heads, vocab {s['vocab']}: "
          f"{s['params'] / 1e9:.2f} B parameters; F16 {s['bytes'] / 1e9:.2f} GB in {t_f16:.0f} s"
          + (f"; {'; '.join(made)}" if made else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

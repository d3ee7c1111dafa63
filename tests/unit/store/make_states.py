"""Produce real llama.cpp per-sequence KV states for the store's tests, in a subprocess of its own.

Two prompts that share their first 300 tokens are decoded on SmolLM2 (one model load, n_threads 1),
each from an empty sequence, with flash attention off (V written transposed) and on (V written as rows),
so the parser meets both V layouts. The states and their token lists land in OUT as ``<name>.bin`` and
``<name>.json``; the store's tests cache OUT for the whole session.

    python make_states.py MODEL OUT
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp as C

SHARED = 300
TAIL = 100


def tokens_for(model, text: str) -> list[int]:
    vocab = C.llama_model_get_vocab(model)
    buf = (C.llama_token * 8192)()
    n = C.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 8192, False, False)
    assert n > 0, n
    return list(buf[:n])


def state_of(ctx, toks: list[int]) -> bytes:
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    arr = (C.llama_token * len(toks))(*toks)
    assert C.llama_decode(ctx, C.llama_batch_get_one(arr, len(toks))) == 0
    size = C.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    n = C.llama_state_seq_get_data(ctx, buf, size, 0)
    assert n == size, (n, size)
    return bytes(buf)


def main(model_path: str, out: str) -> None:
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    model = C.llama_model_load_from_file(model_path.encode(), mp)
    assert model
    base = tokens_for(model, " ".join(f"Fact {i}: the number {i * 7} is written as {i * 7:b} in binary." for i in range(40)))
    shared = base[:SHARED]
    other = tokens_for(model, " ".join(f"Note {i}: a cat named {i * 3} sat on mat {i}." for i in range(30)))
    third = tokens_for(model, " ".join(f"Step {i}: turn the dial to {i * 5} and wait {i} seconds." for i in range(30)))
    prompts = {"a": shared + base[SHARED:SHARED + TAIL], "b": shared + other[:TAIL], "c": shared + third[:TAIL],
               "p": shared}
    assert len(prompts["a"]) == len(prompts["b"]) == len(prompts["c"]) == SHARED + TAIL  # "p": the shared prefix alone
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for fa, tag in ((0, "trans"), (1, "rows")):
        cp = C.llama_context_default_params()
        cp.n_ctx = 1024
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = fa
        ctx = C.llama_init_from_model(model, cp)
        assert ctx
        for name, toks in prompts.items():
            (dest / f"{name}_{tag}.bin").write_bytes(state_of(ctx, toks))
            (dest / f"{name}_{tag}.json").write_text(json.dumps({"tokens": toks, "flash_attn": fa}))
        C.llama_free(ctx)
    C.llama_model_free(model)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

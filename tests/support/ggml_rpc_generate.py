"""Run in a separate process: load a GGUF with every layer on a remote ggml-RPC device and print
the greedy tokens it generates, as JSON. This is what a peer engine does in COMBINE mode."""

from __future__ import annotations

import ctypes
import json
import sys
import time

from hydrad.engine import ggml, llama, sampling
from hydrad.engine.batch import Batch
from hydrad.common.params import RuntimeParams


def main() -> None:
    endpoint, model_path, prompt, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    C = llama.lib()
    devs = ggml.add_rpc_server(endpoint)
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    mp = C.llama_model_default_params()
    mp.devices = ctypes.cast(arr, ctypes.c_void_p)
    mp.n_gpu_layers = 999
    ptr = C.llama_model_load_from_file(model_path.encode(), mp)
    if not ptr:
        sys.exit("model load through the RPC device failed")
    from pathlib import Path

    model = llama.Model(ptr, Path(model_path))
    # flash attention off: a CUDA build without FA kernels (GGML_CUDA_FA=OFF) aborts the remote server otherwise
    ctx = llama.Context(model, RuntimeParams(n_ctx=512, n_batch=512, n_parallel=1, n_threads=1, flash_attn="off"))
    batch = Batch(512)
    sampler = sampling.Sampler(sampling.Sampling(0, 0, 1, 0, 1, 0, 0, 0, 0))
    tokens = model.tokenize(prompt)
    for i, t in enumerate(tokens):
        batch.add(t, i, 0, i == len(tokens) - 1)
    out: list[int] = []
    pos = len(tokens)
    if batch.decode(ctx) != 0:
        sys.exit("decode failed")
    idx = batch.n - 1
    t0 = time.perf_counter()
    for _ in range(n):
        tok = sampler.sample(ctx, idx)
        out.append(tok)
        batch.clear()
        batch.add(tok, pos, 0, True)
        pos += 1
        if batch.decode(ctx) != 0:
            sys.exit("decode failed")
        idx = 0
    decode_s = time.perf_counter() - t0
    print(json.dumps({"tokens": out, "text": b"".join(model.piece(t) for t in out).decode("utf-8", "replace"),
                      "decode_tps": n / decode_s}))


if __name__ == "__main__":
    main()

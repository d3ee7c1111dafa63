"""Embeddings on the engine's model: a second llama.cpp context on the same weights.

The generation context samples tokens for many slots; an embedding context outputs one vector per
input (pooled) or per token (pooling ``none``) instead. They are kept apart rather than switching
the generation context into embedding mode now and then: llama.cpp fixes the pooling when a
context is created, an embedding decode outputs every token of the batch (the generation
context's output buffer would grow to a whole batch of logits), and an input would need a slot's
KV. The second context is small: its KV holds ``n_ubatch`` tokens, the longest input (a pooled
input must fit in one physical batch, as llama-server requires), and it is emptied after every
decode. Only the engine thread uses it, between generation steps (``engine/embedjobs.py``).

A reranker's context pools with ``rank``: its classification head gives each input a few numbers
(its classes) instead of a vector, the first being the input's score (``engine/rerank.py``). Only a
GGUF that declares rank pooling has that head; rank asked of another model fails the load.
"""

from __future__ import annotations

import base64
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.engine import llama
from hydrad.engine.batch import Batch
from hydrad.engine.rerank import PromptFormat

POOLING = {"model": -1, "none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {v: k for k, v in POOLING.items() if v >= 0}
MAX_SEQS = 32
"""Most inputs one embedding decode computes together (llama.cpp's sequences of the context)."""


class Embedder:
    """The embedding context of one generation; engine thread only (built by the loader thread)."""

    def __init__(self, model: llama.Model, params: RuntimeParams) -> None:
        self.model = model
        self.n_tokens = min(params.n_ubatch, params.n_batch)
        self.ctx = llama.Context(model, params, pooling=POOLING[params.pooling], n_tokens=self.n_tokens, n_seq=MAX_SEQS)
        try:
            self.batch = Batch(self.ctx.n_batch)
        except Exception:
            self.ctx.free()
            raise
        C = llama.lib()
        self.pooling = POOLING_NAMES.get(C.llama_pooling_type(self.ctx.ptr), "unknown")
        declared = model.meta(f"{model.info.arch}.pooling_type")
        if self.pooling == "rank" and declared != str(POOLING["rank"]):
            self.free()
            named = POOLING_NAMES.get(int(declared), declared) if declared and declared.isdigit() else declared
            raise llama.LoadError(f"pooling: rank needs a reranker, a GGUF that declares rank pooling and has a "
                                  f"classification head; {model.path.name} declares "
                                  f"{'pooling ' + str(named) if named else 'no pooling'} (set pooling: mean for "
                                  "embeddings)")
        if self.pooling not in ("none", "mean", "cls", "last", "rank"):
            self.free()
            raise llama.LoadError(f"the model's pooling ({self.pooling}) gives no embeddings; set pooling: mean")
        # a reranker's output per input: its classes' scores (llama.cpp's n_cls_out), not a vector
        self.n_embd = C.llama_model_n_cls_out(model.ptr) if self.rank else C.llama_model_n_embd_out(model.ptr)
        self.prompts = PromptFormat.of(model) if self.rank else None  # how a reranker's pairs are put
        self.decodes = 0

    @property
    def rank(self) -> bool:
        """A reranker's context: /rerank is served, the embeddings endpoints are not."""
        return self.pooling == "rank"

    @property
    def pooled(self) -> bool:
        return self.pooling != "none"

    def run(self, inputs: list[list[int]]) -> list[Any]:
        """One decode of ``inputs`` (together at most ``n_tokens`` tokens and MAX_SEQS inputs, each
        non-empty): per input a float32 vector (pooled) or a (tokens × n_embd) matrix (none)."""
        import numpy as np

        C = llama.lib()
        self.ctx.clear()
        self.batch.clear()
        rows: list[tuple[int, int]] = []
        for seq, tokens in enumerate(inputs):
            rows.append((self.batch.n, len(tokens)))
            self.batch.add_run(tokens, 0, seq, True, output_all=True)
        rc = self.batch.decode(self.ctx)
        self.decodes += 1
        if rc != 0:
            raise RuntimeError(f"llama_decode of {self.batch.n} embedding tokens failed ({rc})")
        out: list[Any] = []
        for seq, (first, n) in enumerate(rows):
            if self.pooled:
                ptr = C.llama_get_embeddings_seq(self.ctx.ptr, seq)
                if not ptr:
                    raise RuntimeError(f"llama.cpp gave no pooled embedding for input {seq}")
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy())
                continue
            matrix = np.empty((n, self.n_embd), dtype=np.float32)
            for j in range(n):
                ptr = C.llama_get_embeddings_ith(self.ctx.ptr, first + j)
                if not ptr:
                    raise RuntimeError(f"llama.cpp gave no embedding for token {j} of input {seq}")
                matrix[j] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
            out.append(matrix)
        self.ctx.clear()
        return out

    def free(self) -> None:
        self.batch.free()
        self.ctx.free()


def normalized(vector: Any, norm: int) -> Any:
    """llama-server's ``embd_normalize`` (common_embd_normalize): -1 none, 0 scaled to the int16 range
    by the largest magnitude, 1 taxicab, 2 Euclidean (the default), p > 2 the p-norm. A zero vector
    stays zero. Computed in float64 so that a large p does not overflow."""
    import numpy as np

    v = np.asarray(vector, dtype=np.float64)
    if norm == -1:
        return v.astype(np.float32)
    a = np.abs(v)
    if norm == 0:
        total = float(a.max(initial=0.0)) / 32760.0
    elif norm == 2:
        total = float(np.sqrt(np.dot(v, v)))
    else:
        scale = float(a.max(initial=0.0))  # p-norm of v/scale, times scale: no overflow for large p
        total = scale * float(np.sum((a / scale) ** norm)) ** (1.0 / norm) if scale > 0 else 0.0
    factor = 1.0 / total if total > 0.0 and np.isfinite(total) else 0.0
    return (v * factor).astype(np.float32)


def as_base64(vector: Any) -> str:
    """OpenAI's ``encoding_format: base64``: the little-endian float32 bytes, base64-encoded."""
    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")

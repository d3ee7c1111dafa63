"""A llama.cpp batch: the token rows of one ``llama_decode`` step, filled by the engine thread (a
slot's next token, or a run of its prompt) and handed to a context."""

from __future__ import annotations

import ctypes

from hydrad.engine.llama import Context, lib


class Batch:
    """A preallocated llama_batch filled in place each step (no per-step allocation)."""

    def __init__(self, capacity: int) -> None:
        C = lib()
        self.capacity = capacity
        self.raw = C.llama_batch_init(capacity, 0, 1)
        self.n = 0
        self._token = self.raw.token
        self._pos = self.raw.pos
        self._nseq = self.raw.n_seq_id
        self._seq = self.raw.seq_id
        self._logits = self.raw.logits
        import numpy as np

        # numpy views of the same C arrays: a prompt chunk is written with a few slice assignments
        # instead of five ctypes stores per token
        self._np_token = np.ctypeslib.as_array(self._token, shape=(capacity,))
        self._np_pos = np.ctypeslib.as_array(self._pos, shape=(capacity,))
        self._np_nseq = np.ctypeslib.as_array(self._nseq, shape=(capacity,))
        self._np_logits = np.ctypeslib.as_array(self._logits, shape=(capacity,))
        self._np_arange = np.arange(capacity, dtype=np.int32)
        # seq_id is an array of per-token pointers to separately allocated rows; point them into one
        # contiguous array we own so seq ids are written by slice too (the originals go back before free).
        # The pointers are rewritten as one numpy array: a Python loop over n_batch of them on the loader
        # thread slows the serving generation's steps (docs/engine.md, "the interpreter lock").
        self._seq_own = np.zeros(capacity, dtype=np.int32)
        self._np_seq_ptrs = np.ctypeslib.as_array(ctypes.cast(self._seq, ctypes.POINTER(ctypes.c_uint64)),
                                                  shape=(capacity,))
        self._seq_orig = self._np_seq_ptrs.copy()
        self._np_seq_ptrs[:] = self._seq_own.ctypes.data + 4 * np.arange(capacity, dtype=np.uint64)

    def clear(self) -> None:
        self.n = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        i = self.n
        self._token[i] = token
        self._pos[i] = pos
        self._nseq[i] = 1
        self._seq_own[i] = seq
        self._logits[i] = logits
        self.n = i + 1
        return i

    def add_run(self, tokens: list[int], pos0: int, seq: int, logits_last: bool, output_all: bool = False) -> int:
        """Add consecutive positions of one sequence; returns the index of the last token. ``output_all``:
        every token is an output (an embedding context pools over them)."""
        i, k = self.n, len(tokens)
        self._np_token[i:i + k] = tokens
        self._np_pos[i:i + k] = self._np_arange[:k] + pos0
        self._np_nseq[i:i + k] = 1
        self._np_logits[i:i + k] = 1 if output_all else 0
        self._seq_own[i:i + k] = seq
        if logits_last:
            self._np_logits[i + k - 1] = 1
        self.n = i + k
        return i + k - 1

    def decode(self, ctx: Context) -> int:
        self.raw.n_tokens = self.n
        return int(lib().llama_decode(ctx.ptr, self.raw))

    def free(self) -> None:
        if self.raw is not None:
            self._np_seq_ptrs[:] = self._seq_orig
            self.raw.n_tokens = self.capacity
            lib().llama_batch_free(self.raw)
            self.raw = None

"""Speculative decoding with a draft model (``spec_type: draft``, llama-server's draft-simple).

A small model of the served model's vocabulary guesses the next tokens greedily; the served model
decodes the guess in the same batch as every other slot's rows and keeps the tokens it agrees with
(:mod:`hydrad.engine.speculate` verifies and rolls back, as for an n-gram draft). What is built here
is the draft model's side: its weights and a context of its own (one sequence per slot), the check
that the two vocabularies are one, and :meth:`DraftModel.propose`, which runs on the engine thread as
part of a step.

The draft context holds, per slot, the KV of a token list (:attr:`DraftModel.held`). Each step that
slot's committed tokens are compared with it: the common prefix stays, the rest (a rejected draft, an
earlier request's tail) is removed, and what the slot gained since (accepted tokens, its next token,
a new prompt) is decoded; then the draft is generated one position at a time, every drafting slot's
token in one batch. A long new prompt is brought in over several steps (:data:`CATCH_UP_PER_STEP`
tokens a step) and that slot drafts once it has caught up, so no step stalls on it.
"""

from __future__ import annotations

from pathlib import Path

from hydrad.common.params import RuntimeParams
from hydrad.engine import llama
from hydrad.engine.adapters import resolve_file
from hydrad.engine.batch import Batch
from hydrad.engine.tokenprefix import common_prefix

CATCH_UP_PER_STEP = 256
"""Most tokens of one slot's history the draft context decodes in one step (a new prompt's KV)."""

VOCAB_SAMPLE = 512
"""Token texts compared between the two vocabularies, spread over all of them (plus every special one)."""

# The parameters a draft model does not share with the served one: its file, placement and context.
# Rope settings are the GGUF's own (the served model's overrides are for the served model).
_OWN = {"kv_overrides": None, "tensor_split": None, "override_tensors": None, "n_cpu_moe": 0, "lora_adapters": None,
        "control_vectors": None, "rope_scaling": "model", "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
        "yarn_orig_ctx": 0}


class VocabMismatch(llama.LoadError):
    """The draft model's vocabulary is not the served model's: its token ids would mean other text."""


def vocab_mismatch(target: llama.Model, draft: llama.Model) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (their vocabularies differ), or None. Compared: the token
    count, the special tokens (BOS, EOS, EOT and whether a BOS is added), and the texts of
    :data:`VOCAB_SAMPLE` tokens spread over the vocabulary, every special token among them."""
    C = llama.lib()
    if target.n_vocab != draft.n_vocab:
        return f"{target.n_vocab} tokens against {draft.n_vocab}"
    for name in ("bos", "eos", "eot"):
        a, b = (getattr(C, f"llama_vocab_{name}")(m.vocab) for m in (target, draft))
        if a != b:
            return f"the {name.upper()} token is {a} against {b}"
    if target.added_bos() != draft.added_bos():
        return "one adds a BOS token to a prompt, the other not"
    n = target.n_vocab
    sample = set(range(0, n, max(1, n // VOCAB_SAMPLE))) | {n - 1} | set(target.eog_tokens())
    for tok in sorted(sample):
        if target.piece(tok) != draft.piece(tok) or target.is_eog(tok) != draft.is_eog(tok):
            return f"token {tok} is {target.piece(tok)!r} against {draft.piece(tok)!r}"
    return None


def draft_params(params: RuntimeParams) -> RuntimeParams:
    """The served model's parameters as the draft model loads with them: its own layers on the GPU and
    context size, the same slots, batch, threads and cache types."""
    return params.model_copy(update={**_OWN, "n_gpu_layers": params.spec_draft_n_gpu_layers,
                                     "n_ctx": params.spec_draft_n_ctx or params.n_ctx})


class DraftModel:
    """The draft model, its context (a sequence per slot) and the token list each sequence's KV holds.
    Owned by its generation; used on the engine thread only."""

    def __init__(self, model: llama.Model, ctx: llama.Context) -> None:
        import numpy as np  # after libllama (preload_native)

        self.model = model
        self.ctx = ctx
        self.batch = Batch(ctx.n_batch)
        self.held: list[list[int]] = [[] for _ in range(ctx.n_seq)]
        self._np = np
        self._as_array = np.ctypeslib.as_array
        self.n_vocab = model.n_vocab

    @classmethod
    def load(cls, target: llama.Model, params: RuntimeParams, models_dir: Path) -> "DraftModel":
        """Load the draft model of ``params`` for ``target`` on the loader thread; LoadError naming
        ``spec_draft_model`` when the file is missing, fails to load, or speaks another vocabulary."""
        given = params.spec_draft_model
        assert given is not None
        path = resolve_file("spec_draft_model", given, models_dir)
        own = draft_params(params)
        try:
            model = llama.Model.load(path, own)
        except llama.LoadError as exc:
            raise llama.LoadError(f"spec_draft_model: {exc}") from None
        why = vocab_mismatch(target, model)
        if why is not None:
            model.free()
            raise VocabMismatch(f"spec_draft_model: {path.name} cannot draft for {target.path.name}: their "
                                f"vocabularies differ ({why})")
        try:
            ctx = llama.Context(model, own)
        except Exception:
            model.free()
            raise
        draft = cls(model, ctx)
        try:
            draft.warmup()
        except Exception:
            draft.free()
            raise
        return draft

    def warmup(self) -> None:
        """A few tokens through the draft context, then the check that it can drop a sequence's tail (a
        recurrent model cannot: every rejected draft would leave its guess in the state)."""
        tok = max(0, llama.lib().llama_vocab_bos(self.model.vocab))
        self.batch.clear()
        self.batch.add_run([tok] * 4, 0, 0, True)
        if self.batch.decode(self.ctx) != 0:
            raise llama.LoadError("spec_draft_model: the draft model's warm-up decode failed")
        ok = self.ctx.seq_rm(0, 2, -1)
        self.ctx.clear()
        if not ok:
            raise llama.LoadError("spec_draft_model: the draft model's memory cannot drop a sequence's tail (a "
                                  "recurrent model), so a rejected draft could not be taken back")

    def rebuild(self, params: RuntimeParams) -> None:
        """A new context for new parameters (the served model's context was rebuilt: slots, batch,
        threads); the sequences start empty and catch up with their slots."""
        ctx = llama.Context(self.model, draft_params(params))
        self.batch.free()
        self.ctx.free()
        self.ctx = ctx
        self.batch = Batch(ctx.n_batch)
        self.held = [[] for _ in range(ctx.n_seq)]

    def _pick(self, row: int, p_min: float) -> int:
        """The draft model's greedy token of batch row ``row``; -1 when it gives it less than ``p_min``."""
        ptr = llama.lib().llama_get_logits_ith(self.ctx.ptr, row)
        if not ptr:
            return -1
        logits = self._as_array(ptr, shape=(self.n_vocab,))
        tok = int(logits.argmax())
        if p_min > 0 and 1.0 / float(self._np.exp(logits - logits[tok]).sum()) < p_min:
            return -1
        return tok

    def _forget(self, seq: int) -> None:
        self.ctx.seq_rm(seq, -1, -1)
        self.held[seq] = []

    def _decode(self, busy: set[int]) -> bool:
        """Decode the batch; when the draft context's pool is full, the sequences of slots not drafting
        this step are dropped and the decode tried once more. False: this step drafts no further."""
        rc = self.batch.decode(self.ctx)
        if rc == 1 and any(self.held[s] for s in range(len(self.held)) if s not in busy):
            for s in range(len(self.held)):
                if s not in busy:
                    self._forget(s)
            rc = self.batch.decode(self.ctx)
        if rc != 0:
            for s in busy:
                self._forget(s)
            return False
        return True

    def propose(self, wants: list[tuple[int, list[int], int]], p_min: float) -> dict[int, list[int]]:
        """Drafts for ``wants``: (slot id, the slot's committed tokens with its next token last, most
        tokens to draft). Each slot's sequence is first brought level with its tokens; then one batch per
        drafted position, a token for every slot still drafting (greedy; one under ``p_min`` ends that
        slot's draft). The last drafted token is not decoded here: the served model decodes it."""
        batch, ctx = self.batch, self.ctx
        batch.clear()
        live: list[tuple[int, int, list[int]]] = []  # (slot, room, its draft so far)
        rows: dict[int, int] = {}
        busy: set[int] = set()
        for seq, hist, room in wants:
            if seq >= len(self.held) or not hist:
                continue
            held = self.held[seq]
            keep = min(common_prefix(held, hist), len(hist) - 1)  # the last token is decoded for its logits
            if keep < len(held):
                if not ctx.seq_rm(seq, keep, -1):
                    self._forget(seq)
                    keep = 0
                del held[keep:]
            todo = hist[keep:]
            step = min(CATCH_UP_PER_STEP, batch.capacity - batch.n)
            room = min(room, ctx.n_ctx_seq - len(hist) - 1)
            if step <= 0:
                break
            busy.add(seq)
            if len(todo) > step or room <= 0:  # catching up with a new prompt: no draft this step
                take = todo[:step] if len(hist) < ctx.n_ctx_seq else []
                if take:
                    batch.add_run(take, keep, seq, False)
                    held.extend(take)
                continue
            rows[seq] = batch.add_run(todo, keep, seq, True)
            held.extend(todo)
            live.append((seq, room, []))
        drafts: dict[int, list[int]] = {}
        while batch.n:
            if not self._decode(busy):
                return {}
            batch.clear()
            going: list[tuple[int, int, list[int]]] = []
            for seq, room, draft in live:
                tok = self._pick(rows[seq], p_min)
                if tok >= 0:
                    draft.append(tok)
                if draft:
                    drafts[seq] = draft
                if tok < 0 or len(draft) >= room or self.model.is_eog(tok):
                    continue
                rows[seq] = batch.add(tok, len(self.held[seq]), seq, True)
                self.held[seq].append(tok)
                going.append((seq, room, draft))
            live = going
        return drafts

    def free(self) -> None:
        self.batch.free()
        self.ctx.free()
        self.model.free()

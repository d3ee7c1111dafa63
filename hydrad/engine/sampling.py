"""Sampling on llama.cpp: the sampler chain per request, its grammar, and the log-probabilities a
request may ask for. Apart from the model and context (:mod:`hydrad.engine.llama`) since sampling
is per request and per token, where loading is per model."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from hydrad.engine.llama import Context, lib
from hydrad.wire.logprobs import FLOOR, Alternative, TokenLogprob


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    frequency_penalty: float
    presence_penalty: float
    seed: int
    ban: tuple[int, ...] = ()  # tokens never to sample (ignore_eos bans the end-of-generation tokens)
    bias: tuple[tuple[int, float], ...] = ()  # a request's logit_bias, token by token (-inf: banned)
    grammar: str | None = None  # GBNF the output must match, checked by hydrad.wire.grammar


END_OF_GRAMMAR = -1
"""What a constrained sampler returns when its grammar admits no further token (it is complete and
the end-of-generation tokens are banned, or nothing in the vocabulary can continue it)."""


GRAMMAR_STEP_LIMIT_S = 0.5
"""Most CPU time (of the engine thread) one token's grammar work may take. A grammar whose ambiguity grows with the text
(``r ::= "a" r "b" | "a" r "c" | ""`` doubles llama.cpp's stacks per "a") cannot be bounded before
it runs; it ends its request the first time a token costs this much, before it stalls the engine."""


GRAMMAR_ACCEPT_LIMIT_S = GRAMMAR_STEP_LIMIT_S / 64
"""Most CPU time accepting one token into a grammar may take before the request ends at its next
token. An ambiguous grammar's stacks multiply with every character accepted and llama.cpp
deduplicates them in quadratic time, so one accept costs many times the one before (measured on
SmolLM2: 1.5, 4.9, 75, 294 ms, then 8.2 s for a two-character token): waiting for a step to pass
GRAMMAR_STEP_LIMIT_S let one step hold the engine thread for seconds."""


class GrammarTooSlow(RuntimeError):
    """A grammar whose work per token passed GRAMMAR_STEP_LIMIT_S: its request ends (400)."""

    code = "grammar_too_slow"


class GrammarUnsatisfiable(ValueError):
    """A grammar that admits no token of this model at the start of the answer, end of generation
    included: no answer can satisfy it (400, where an empty 200 would look like one)."""

    code = "grammar_unsatisfiable"


class GrammarRefused(ValueError):
    """llama.cpp would not build a grammar that the doors' checker passed: a ``<token>`` that is not
    exactly one token of this model, or left recursion. The request's fault: a 400."""


class _Grammar:
    """llama.cpp's grammar sampler, applied as llama-server applies it: the chain picks a token from
    the raw logits, and only when the grammar rejects that token are the logits masked by the
    grammar (a pass over the whole vocabulary) and the chain run again. Sampling and accepting stay
    in Python's hands, not the chain's, so a token the grammar rejects is never accepted: llama.cpp
    aborts the process on that."""

    def __init__(self, vocab: Any, text: str, n_vocab: int) -> None:
        C = lib()
        self.ptr = C.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not self.ptr:
            raise GrammarRefused("grammar: llama.cpp refused it (left recursion, or a <token> that is not "
                                 "exactly one token of this model)")
        import numpy as np

        self._as_array = np.ctypeslib.as_array
        self._raw = (C.llama_token_data * n_vocab)()
        self._cand = np.ctypeslib.as_array(self._raw)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._all = C.llama_token_data_array(self._raw, n_vocab, -1, False)
        self._one_raw = (C.llama_token_data * 1)()
        self._one = C.llama_token_data_array(self._one_raw, 1, -1, False)
        self._neg_inf = float("-inf")

    def logits(self, row: Any) -> Any:
        """The logits row as an array, without a copy (the pass below copies it into candidates)."""
        return self._as_array(row, shape=(len(self._ids),))

    def pick(self, chain: Any, logits: Any, constrained: bool) -> int | None:
        """The chain's choice over every token (masked by the grammar when ``constrained``); None
        when nothing with a finite logit is left to choose."""
        C = lib()
        cand, arr = self._cand, self._all
        cand["id"] = self._ids
        cand["logit"] = logits
        cand["p"] = 0.0
        arr.size, arr.selected, arr.sorted = len(self._ids), -1, False
        if constrained:
            C.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        C.llama_sampler_apply(chain, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            return None
        chosen = arr.data[arr.selected]
        return None if chosen.logit == self._neg_inf else int(chosen.id)

    def allows(self, token: int, logit: float) -> bool:
        one = self._one_raw[0]
        one.id, one.logit, one.p = token, logit, 0.0
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        lib().llama_sampler_apply(self.ptr, ctypes.byref(self._one))
        return bool(one.logit != self._neg_inf)

    def accept(self, token: int) -> None:
        lib().llama_sampler_accept(self.ptr, token)

    def free(self) -> None:
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None


PRESELECT_MIN_VOCAB = 100_000
PRESELECT_WIDTHS = (8.0, 16.0, 32.0, 64.0)  # band widths tried: a sampled row's top 40 rarely lie within 4


def fold_seed(seed: int) -> int:
    """A seed llama.cpp can take (32 bits) for one of up to 64: those below 2**32 as they are (the
    same streams as llama-server's), larger ones hashed, so that two seeds differing only in their
    high bits no longer give the same answer (the low 32 bits alone were used)."""
    if seed < 1 << 32:
        return seed
    return int.from_bytes(hashlib.blake2b(seed.to_bytes(16, "little"), digest_size=4).digest(), "little")


class Sampler:
    """A llama.cpp sampler chain: sampling runs in C, one call per token. A request with a grammar
    adds llama.cpp's grammar sampler (built for that request alone, so others pay nothing)."""

    def __init__(self, s: Sampling, n_vocab: int = 0, n_ctx: int = 0, vocab: Any = None, post: bool = False) -> None:
        """``post``: the request reports probabilities after the chain (:class:`PostProbs`), so a
        sampled row always goes through a candidate array this object can read back."""
        C = lib()
        self.temperature = s.temperature
        self.n_sampled = 0  # rows sampled so far (a token forced past a think budget is not)
        self.last: Any = None  # the numpy view of the candidates the chain last ran on, and its size
        self.last_n = 0
        if n_ctx > 0 and s.repeat_last_n > n_ctx:  # its history ring is allocated up front: bound it
            s = dataclasses.replace(s, repeat_last_n=n_ctx)
        self.grammar = _Grammar(vocab, s.grammar, n_vocab) if s.grammar is not None else None
        self._accept_s = 0.0  # the last token's accept into the grammar (GRAMMAR_ACCEPT_LIMIT_S)
        # Greedy without penalties keeps no state: an argmax over the logits row picks the same token
        # (the first of equal maxima, as llama.cpp's greedy sampler does) without building the
        # n_vocab-entry candidate array the chain sorts through: 186 µs → 15 µs a token for
        # Gemma-3's 262,144-token vocabulary on the 2-core machine, per slot and step.
        self.argmax = (s.temperature <= 0 and n_vocab > 0 and s.repeat_penalty == 1.0
                       and not s.frequency_penalty and not s.presence_penalty and self.grammar is None
                       and not s.bias)
        self.n_vocab = n_vocab
        # Sampled without penalties: the chain's first filter is top-k, so the k largest logits, found
        # over the row with numpy (a compare and a count, not a sort), are all the chain needs to see,
        # where llama_sampler_sample builds and sorts an n_vocab-entry candidate array per row and token.
        # Only for large vocabularies: below PRESELECT_MIN_VOCAB the chain's own top-k (a bucket sort)
        # is as fast (SmolLM2's 49,152: 67 µs a row either way on the 2-core machine; Gemma's 262,144:
        # 214 µs → 119 µs).
        self.preselect = (s.temperature > 0 and 0 < s.top_k < n_vocab and n_vocab >= PRESELECT_MIN_VOCAB
                          and s.repeat_penalty == 1.0 and not s.frequency_penalty and not s.presence_penalty
                          and self.grammar is None and not s.bias)
        self._k = s.top_k
        if post and s.temperature > 0 and self.grammar is None and not self.preselect:
            # every candidate, not the top k: penalties and biases may move a token across the k-th logit
            self.preselect, self._k = True, n_vocab
        if self.argmax or self.preselect:  # both read the logits row with numpy
            import numpy as np  # after libllama (preload_native); once per request, not per token

            self._np = np
            self._as_array = np.ctypeslib.as_array
            self._ban = np.asarray(s.ban, dtype=np.int64) if s.ban else None
            self._neg_inf = -np.inf
        if self.argmax:
            self.ptr = None
            return
        if self.preselect:
            self._cand = (C.llama_token_data * self._k)()
            self._cand_np = np.frombuffer(self._cand, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
            self._cur = C.llama_token_data_array(self._cand, self._k, -1, False)
            self._cur_ref = ctypes.byref(self._cur)
        sp = C.llama_sampler_chain_default_params()
        sp.no_perf = True
        self.ptr = C.llama_sampler_chain_init(sp)
        add = lambda smpl: C.llama_sampler_chain_add(self.ptr, smpl)  # noqa: E731
        if s.ban or s.bias:  # the chain's first step, as llama-server's logit bias is
            pairs = [*((tok, float("-inf")) for tok in s.ban), *s.bias]
            biases = (C.llama_logit_bias * len(pairs))()
            for i, (tok, bias) in enumerate(pairs):
                biases[i].token = tok
                biases[i].bias = bias
            add(C.llama_sampler_init_logit_bias(n_vocab, len(pairs), biases))
        if s.repeat_penalty != 1.0 or s.frequency_penalty or s.presence_penalty:
            # The bundled llama.cpp's signature leads with n_vocab (older releases had four arguments).
            add(C.llama_sampler_init_penalties(n_vocab, s.repeat_last_n, s.repeat_penalty, s.frequency_penalty,
                                               s.presence_penalty))
        if s.temperature <= 0:
            add(C.llama_sampler_init_greedy())
        else:
            if s.top_k > 0:
                add(C.llama_sampler_init_top_k(s.top_k))
            if s.top_p < 1.0:
                add(C.llama_sampler_init_top_p(s.top_p, 1))
            if s.min_p > 0:
                add(C.llama_sampler_init_min_p(s.min_p, 1))
            add(C.llama_sampler_init_temp(s.temperature))
            seed = fold_seed(s.seed) if s.seed >= 0 else int.from_bytes(os.urandom(4), "little")
            add(C.llama_sampler_init_dist(seed))

    def sample(self, ctx: Context, idx: int) -> int:
        self.n_sampled += 1
        if self.grammar is not None:
            return self._sample_constrained(ctx, idx)
        if self.argmax:
            return int(self._row(ctx, idx).argmax())
        if self.preselect:
            return self._sample_preselected(ctx, idx)
        # llama_sampler_sample also accepts the token into the chain (penalty history)
        return int(lib().llama_sampler_sample(self.ptr, ctx.ptr, idx))

    def force(self, token: int) -> None:
        """``token`` is the answer's next though the engine chose it (the end of a think block, past its
        budget): the chain's penalties count it as if sampled. Never under a grammar (see
        :mod:`hydrad.engine.thinking`), whose state a token it rejects would break."""
        if self.grammar is not None:
            raise RuntimeError("a token cannot be forced under a grammar")
        if self.ptr:
            lib().llama_sampler_accept(self.ptr, token)

    def _row(self, ctx: Context, idx: int) -> Any:
        """Batch row ``idx``'s logits as a numpy view, banned tokens set to -inf (the row is read by
        nobody after the sampler). Waits for the device, as the chain would."""
        row = lib().llama_get_logits_ith(ctx.ptr, idx)
        if not row:
            raise RuntimeError(f"no logits for batch row {idx}")
        logits = self._as_array(row, shape=(self.n_vocab,))
        if self._ban is not None:
            logits[self._ban] = self._neg_inf
        return logits

    def _sample_preselected(self, ctx: Context, idx: int) -> int:
        """What llama_sampler_sample does (apply the chain, take the selected token, accept it), on the
        row's top-k candidates instead of all n_vocab."""
        C = lib()
        logits = self._row(ctx, idx)
        ids = top_ids(self._np, logits, self._k, widths=PRESELECT_WIDTHS)
        cand = self._cand_np
        n = len(ids)
        cand["id"][:n] = ids
        cand["logit"][:n] = logits[ids]
        cand["p"][:n] = 0.0
        cur = self._cur
        cur.size, cur.selected, cur.sorted = n, -1, False
        C.llama_sampler_apply(self.ptr, self._cur_ref)
        if not 0 <= cur.selected < cur.size:
            raise RuntimeError("the sampler chain selected no token")
        token = int(cur.data[cur.selected].id)
        C.llama_sampler_accept(self.ptr, token)
        self.last, self.last_n = cand, cur.size
        return token

    def _sample_constrained(self, ctx: Context, idx: int) -> int:
        """A token the grammar allows, accepted into the chain and the grammar; END_OF_GRAMMAR when
        the grammar allows none."""
        assert self.grammar is not None
        row = lib().llama_get_logits_ith(ctx.ptr, idx)  # waits for the device: the clock starts after it
        if not row:
            raise RuntimeError(f"no logits for batch row {idx}")
        t0 = time.thread_time()  # CPU, not wall: a busy machine that preempts the thread must not fail requests
        logits = self.grammar.logits(row)
        tok = self.grammar.pick(self.ptr, logits, constrained=False)
        if tok is None or not self.grammar.allows(tok, float(logits[tok])):
            tok = self.grammar.pick(self.ptr, logits, constrained=True)
            if tok is None:
                return END_OF_GRAMMAR
        self.last, self.last_n = self.grammar._cand, self.grammar._all.size
        if self._accept_s > GRAMMAR_ACCEPT_LIMIT_S:
            raise GrammarTooSlow(f"grammar: accepting a token took {self._accept_s * 1000:.0f} ms and grows with "
                                 "each token (the grammar is too ambiguous for llama.cpp's grammar sampler)")
        t_accept = time.thread_time()
        lib().llama_sampler_accept(self.ptr, tok)
        self.grammar.accept(tok)
        self._accept_s = time.thread_time() - t_accept
        spent = time.thread_time() - t0
        if spent > GRAMMAR_STEP_LIMIT_S:
            raise GrammarTooSlow(f"grammar: one token took {spent:.2f} s of grammar work (the grammar is too "
                                 "ambiguous for llama.cpp's grammar sampler)")
        return tok

    def free(self) -> None:
        if self.grammar is not None:
            self.grammar.free()
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None


def _logprob(x: float) -> float:
    """A log-probability JSON can carry: at most 0 (rounding), at least FLOOR (a logit of -inf; NaN
    from a broken row)."""
    return 0.0 if x > 0.0 else x if x >= FLOOR else FLOOR


def top_ids(np: Any, row: Any, k: int, m: float | None = None, widths: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0)) -> Any:
    """The ids of the ``k`` largest values of ``row`` (k ≥ 1), in no particular order. The candidates
    are the values within a band below the maximum ``m``, the band widened (``widths``) until it holds
    ``k`` of them (each try a compare and a count over the row, about 20 µs for Gemma-3's 262,144
    logits; listing the indices is what costs, so it is done once, for the few that the narrowest band
    holds), then a partial selection among them. A row without enough within the widest band, or
    without a finite maximum, falls back to a selection over the whole row (about 15 times slower)."""
    n_vocab = row.shape[0]
    if k >= n_vocab:
        return np.arange(n_vocab)
    if m is None:
        m = float(row.max())
    if math.isfinite(m):
        for width in widths:
            band = row >= m - width
            n = int(np.count_nonzero(band))
            if n >= k:
                near = np.flatnonzero(band)
                return near if n == k else near[np.argpartition(row[near], -k)[-k:]]
    return np.argpartition(row, -k)[-k:]


class Logprobs:
    """Log-probabilities of one request's tokens over the full vocabulary, from the raw logits row
    before its sampler reads it: what OpenAI and llama-server report, before top-k, top-p, penalties,
    a grammar or banned tokens change anything. Built only for a request that asks, so the others
    pay nothing. The most likely tokens are found by partial selection among the few near the
    maximum, not by sorting the vocabulary (262,144 logits for Gemma-3)."""

    def __init__(self, n_vocab: int, top: int, piece: Callable[[int], bytes]) -> None:
        import numpy as np  # after libllama (preload_native): a request is admitted once a model is loaded

        self._np = np
        self.n_vocab = n_vocab
        self.top = min(top, n_vocab)
        self._piece = piece
        self._scratch = np.empty(n_vocab, dtype=np.float32)
        self._row: Any = None
        self._lse = 0.0
        self._alts: tuple[Alternative, ...] = ()

    def measure(self, ctx: Context, idx: int) -> None:
        """Read batch row ``idx``: its log-sum-exp and its most likely tokens. Called before sampling,
        since the argmax shortcut masks banned tokens in the row itself."""
        np = self._np
        ptr = lib().llama_get_logits_ith(ctx.ptr, idx)
        if not ptr:
            raise RuntimeError(f"no logits for batch row {idx}")
        row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        with np.errstate(all="ignore"):
            m = float(row.max())
            np.subtract(row, m, out=self._scratch)
            np.exp(self._scratch, out=self._scratch)
            total = float(self._scratch.sum())
        lse = m + math.log(total) if total > 0.0 else math.inf
        self._row, self._lse = row, lse
        self._alts = tuple(Alternative(t, self._piece(t), _logprob(float(row[t]) - lse)) for t in self._top_ids(row, m))

    def _top_ids(self, row: Any, m: float) -> list[int]:
        """The ``top`` largest logits' ids, largest first (the lower id first among equals, as the
        argmax picks)."""
        if self.top <= 0:
            return []
        np = self._np
        ids = top_ids(np, row, self.top, m)
        return ids[np.lexsort((ids, -row[ids]))].tolist()

    def entry(self, token: int) -> TokenLogprob:
        """The sampled token of the row last measured, with that row's most likely tokens."""
        return TokenLogprob(token, self._piece(token), _logprob(float(self._row[token]) - self._lse), self._alts)


class PostProbs:
    """Probabilities after the sampler chain (llama-server's ``post_sampling_probs``): what the chain
    left of the row the request's token was drawn from, as the chain's distribution sampler
    normalised it, most likely first, those of probability 0 left out (as llama-server leaves them).
    A greedy request's chain keeps the one most likely token, so its token has probability 1 and is
    its only alternative, as in llama-server (whose temperature 0 masks every other token); so has a
    token the engine forced (the end of a think block), which no chain drew.

    Read from the candidate array the :class:`Sampler` (built with ``post``) last applied its chain
    to, so it costs a sort of the candidates that survived the chain, not of the vocabulary."""

    def __init__(self, sampler: Sampler, top: int, piece: Callable[[int], bytes]) -> None:
        import numpy as np

        self._np = np
        self.sampler = sampler
        self.top = top
        self._piece = piece
        self._at = -1

    def measure(self, ctx: Context, idx: int) -> None:
        """Before the row is sampled: remembers which row, so that a forced token is told apart."""
        self._at = self.sampler.n_sampled

    def entry(self, token: int) -> TokenLogprob:
        s, np = self.sampler, self._np
        piece = self._piece(token)
        if s.temperature <= 0 or s.n_sampled == self._at or s.last is None:
            return TokenLogprob(token, piece, 1.0, (Alternative(token, piece, 1.0),) if self.top > 0 else ())
        cand = s.last[:s.last_n]
        p = cand["p"]
        order = np.argsort(-p, kind="stable")
        chosen = np.flatnonzero(cand["id"] == token)
        prob = float(p[chosen[0]]) if len(chosen) else 0.0
        alts = []
        for i in order[:self.top].tolist():
            if p[i] <= 0.0:
                break
            alts.append(Alternative(int(cand["id"][i]), self._piece(int(cand["id"][i])), float(p[i])))
        return TokenLogprob(token, piece, prob, tuple(alts))

"""A request occupying a slot (:class:`Active`: its sampler, detokenizer, stop matcher, what it has
made and not yet sent) and the events made of it: a Token of what a step made into text, and the
settings a request that asked for them ran with. The Scheduler (hydrad.engine.batching) owns each
Active; these are its plain parts, apart so that the step's loop reads as a loop."""

from __future__ import annotations

from collections import deque
import math
import time
from dataclasses import dataclass, field
from typing import Any

from hydrad.engine import sampling, speculate, thinking
from hydrad.engine.requests import RequestHandle, Token, Usage

from hydrad.engine.textstream import StopMatcher, Utf8Detokenizer
from hydrad.wire.logprobs import TokenLogprob
from hydrad.wire.toolcalls import ToolStream


@dataclass
class Active:
    """A request occupying a slot."""

    handle: RequestHandle
    prompt_len: int
    cached: int
    pending: list[int]
    max_tokens: int
    sampler: sampling.Sampler
    detok: Utf8Detokenizer
    stopper: StopMatcher
    t_start: float
    t_first: float = 0.0
    n_gen: int = 0
    next_token: int = -1
    unsent: list[int] = field(default_factory=list)  # sampled, not yet turned into text (text_overlap)
    ids: list[int] | None = None  # return_tokens: turned into text, not yet sent with a Token
    faulty: frozenset[str] = frozenset()  # fault-injection tests: stages at which this request fails
    probs: sampling.Logprobs | sampling.PostProbs | None = None  # logprobs: measures each row before sampling
    probs_unsent: deque[TokenLogprob] = field(default_factory=deque)  # one per token of ``unsent``
    probs_made: list[TokenLogprob] = field(default_factory=list)  # made into text, not yet sent with a Token
    tools: ToolStream | None = None  # a request offering tools: its text read into content and calls
    think: thinking.Thinking | None = None  # a chat's think block: its reasoning split off, its budget kept
    settings: dict[str, Any] | None = None  # the values it runs with, when it asked (report_settings)
    n_keep: int = -1  # ctx_shift: tokens a context shift keeps at the head (kvshift.kept); -1: it never shifts
    shifts: int = 0  # context shifts so far
    lora: tuple[float, ...] = ()  # the LoRA scales it runs with: only slots of one set share a step (adapters)
    spec: speculate.Drafter | None = None  # speculative decoding: its n-gram index and draft in flight
    media: Any = None  # a prompt with images (vision.MediaPrompt): its image chunks, evaluated as prefill reaches them
    timings: bool = False  # each Token carries the timings so far (timings_per_token)



def take_ids(a: Active) -> tuple[int, ...]:
    """The token ids made into text since the last Token (none unless the request asked for them)."""
    if not a.ids:
        return ()
    ids, a.ids = tuple(a.ids), []
    return ids


def token_event(a: Active, text: str, end: bool = False) -> Token | None:
    """A Token event for ``text``, with the ids and log-probabilities of the tokens made into text
    since the last one and the timings so far (when the request asked for them). A chat's thinking is split off first,
    then a request offering tools sends the content and calls the rest makes (``end``: what is left,
    at its end); None when there is nothing to send."""
    reasoning = ""
    if a.think is not None:
        reasoning, text = a.think.split(text, end)
    calls: tuple[Any, ...] = ()
    if a.tools is not None:
        text, made = a.tools.feed(text)
        if end:
            more, rest = a.tools.finish()
            text, made = text + more, made + rest
        calls = tuple(made)
    probs: tuple[TokenLogprob, ...] = ()
    if a.probs is not None:
        probs, a.probs_made = tuple(a.probs_made), []
    ids = take_ids(a)
    if not (text or calls or ids or probs or reasoning):
        return None
    so_far = usage_of(a, time.monotonic()) if a.timings else None
    return Token(text, ids, probs, calls, reasoning, so_far)


def usage_of(a: Active, now: float) -> Usage:
    """The request's counts and timings at ``now``: at its end (Done), or so far (a Token of a
    request that asked for llama-server's ``timings_per_token``)."""
    t_first = a.t_first or now
    return Usage(prompt_tokens=a.prompt_len, completion_tokens=a.n_gen, cached_tokens=a.cached,
                 prompt_ms=round((t_first - a.t_start) * 1000, 3), predicted_ms=round((now - t_first) * 1000, 3),
                 queue_ms=round((a.t_start - (a.handle.t_enqueued or a.t_start)) * 1000, 3),
                 draft_n=a.spec.n_drafted if a.spec else 0, draft_n_accepted=a.spec.n_accepted if a.spec else 0)


def settings_of(params: Any, used: sampling.Sampling, n_ctx: int) -> dict[str, Any]:
    """The engine's values a request runs with, as llama-server's ``generation_settings`` names them;
    ``logit_bias`` as llama-server lists it: the request's biases and, with ``ignore_eos``, the
    end-of-generation tokens it bans (a ban's bias is -inf, which JSON writes as null)."""
    biases = [{"token": t, "bias": b if math.isfinite(b) else None} for t, b in used.bias]
    biases += [{"token": t, "bias": None} for t in used.ban]
    return {"logit_bias": biases, "temperature": used.temperature, "top_k": used.top_k, "top_p": used.top_p, "min_p": used.min_p,
            "repeat_penalty": used.repeat_penalty, "seed": used.seed, "repeat_last_n": params.repeat_last_n,
            "n_predict": params.n_predict, "cache_prompt": params.cache_prompt, "n_ctx": n_ctx,
            "n_keep": params.n_keep, "n_cache_reuse": params.n_cache_reuse}

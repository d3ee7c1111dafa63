"""A generation request as it crosses a wire: parsed from OpenAI JSON by the engine's HTTP
plane and by the coordinator's front door, carried in the bus's GENERATE, queued by the engine.

Plain data (no engine state), so the engine and the coordinator share it without importing
each other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from hydrad.wire import logitbias
from hydrad.wire.grammar import check_gbnf
from hydrad.wire.tools import ToolSpec

MAX_STOPS = 4
"""The OpenAI API accepts at most four stop sequences per request."""

MAX_STOP_CHARS = 4096
"""Longest stop sequence accepted. OpenAI documents no bound; one is needed so a request
cannot make the engine hold back (and scan) an unbounded amount of text."""


MAX_FIM_CHARS = 64 << 20
"""Longest ``input_extra`` text a bus message carries (the body limit bounds their sum anyway)."""

_ids = itertools.count(1)


def next_request_id() -> int:
    """A new request's id (unique in this process)."""
    return next(_ids)


def _usable_grammar(text: str | None) -> str | None:
    """Checks a grammar arriving in a bus message as the doors check a client's: the engine
    hands it to llama.cpp's parser, which must never see one that could take it down."""
    if text is not None:
        check_gbnf(text)
    return text


def _bounded_bias(entries: list[tuple[int | str, float | None]] | None) -> list[tuple[int | str, float | None]] | None:
    """A bus message's logit_bias, held to the doors' bounds (hydrad.wire.logitbias)."""
    if entries is not None:  # a ban travels as None (JSON has no -inf); the doors' form says false
        logitbias.parse([[t, False if b is None else b] for t, b in entries])
    return entries


@dataclass(frozen=True)
class SamplingOverrides:
    """Per-request sampling fields; None means 'use the engine's T1 default'."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    grammar: Annotated[str | None, AfterValidator(_usable_grammar)] = None
    """GBNF the output must match (from a request's grammar, json_schema or JSON response_format)."""
    logit_bias: Annotated[list[tuple[int | str, float | None]] | None, AfterValidator(_bounded_bias)] = None
    """Token ids or texts and their biases (None: banned), as :mod:`hydrad.wire.logitbias` read them."""


@dataclass(frozen=True)
class FimChunk:
    """One ``input_extra`` chunk of an /infill request: another file of the project."""

    text: Annotated[str, Field(max_length=MAX_FIM_CHARS)]
    filename: Annotated[str, Field(max_length=4096)] = "tmp"


@dataclass(frozen=True)
class InfillParts:
    """What an /infill request's prompt is made of. The prompt itself needs the serving model's
    fill-in-the-middle tokens, so the engine builds it (``hydrad.engine.fim``) where it tokenizes
    any prompt: off its thread, when the request is prepared. ``prefix`` and ``suffix`` are texts
    and token ids in order (llama-server's mixed prompts); ``middle`` is the request's ``prompt``."""

    prefix: list[str | Annotated[int, Field(ge=0, le=2**31 - 1)]]
    suffix: list[str | Annotated[int, Field(ge=0, le=2**31 - 1)]]
    extra: Annotated[list[FimChunk], Field(max_length=1024)] = field(default_factory=list)
    middle: str = ""


MAX_LORA_ENTRIES = 64
"""Entries of a request's ``lora`` list (each names an adapter by id; the last of an id wins)."""


@dataclass(frozen=True)
class LoraScale:
    """One entry of a request's ``lora`` (llama-server's per-request LoRA): the adapter's id, as GET
    /lora-adapters lists it, and the scale it applies with."""

    id: Annotated[int, Field(ge=0, le=2**31 - 1)]
    scale: Annotated[float, Field(ge=-1000, le=1000, allow_inf_nan=False)] = 0.0


@dataclass
class GenRequest:
    """One generation: a raw prompt (completions), prompt token ids (llama-server's /completion) or
    chat messages."""

    prompt: str | None = None
    prompt_ids: list[int] | None = None  # the prompt as token ids, used as given (no BOS added)
    messages: list[dict[str, str]] | None = None
    images: list[bytes] | None = None  # image files, in the order of the markers in the prompt (hydrad.wire.images)
    tools: ToolSpec | None = None  # functions the model may call (chat only; hydrad.wire.tools)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks); a llama-server extension
    slot: int | None = None  # pin to a slot (llama-server's id_slot), e.g. one restored from migrated KV
    cache_prompt: bool | None = None  # reuse a slot's matching prefix; None: the engine's T1 cache_prompt
    n_keep: int | None = None  # prompt tokens a context shift keeps (-1: all); None: the engine's T1 n_keep
    n_cache_reuse: int | None = None  # smallest cached chunk reused by KV shifting; None: the engine's T1 setting
    cache_salt: str | None = None  # the client's own cache partition (vLLM's cache_salt): read by the door ...
    cache_ns: str = ""  # ... into the namespace of its prompt cache, with its tenant (hydrad.common.tenants)
    store_quota: int = 0  # bytes of the KV Store its tenant's objects may hold (set by the door, 0: no quota)
    pool_pin: bool = False  # ``slot`` was chosen by the coordinator, for the state it put there itself
    return_tokens: bool = False  # the generated token ids travel with the text (Token.ids, Done.ids)
    logprobs: int | None = None  # each token's log-probability and this many most likely; None: not asked
    post_sampling_probs: bool = False  # ... as probabilities after the sampler chain (llama-server's field)
    timings_per_token: bool = False  # each Token carries the timings so far (a stream that asked)
    return_progress: bool = False  # Progress events while the prompt is prefilled (a /completion stream)
    report_settings: bool = False  # Done carries the engine's values the request ran with (/completion's answer)
    infill: InfillParts | None = None  # an /infill request: the prompt is built from these for the serving model
    reasoning_format: str | None = None  # a chat's thinking: none | deepseek | deepseek-legacy; None: the engine's T1
    reasoning_budget: int | None = None  # tokens a chat may think for (0: none); None: the engine's T1 reasoning_budget
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the jinja chat template (hydrad.common.templatekwargs)
    lora: list[LoraScale] | None = None  # LoRA scales by adapter id; None or empty: the engine's (POST /lora-adapters)
    tokens: list[int] | None = None  # prompt tokens made off the engine thread (PromptPrep.prepare) ...
    tokens_for: int | None = None  # ... for this generation id; another generation tokenizes again
    stored_prefix: object = None  # a prefix read from the Store off the engine thread (engine.prefixshare)
    media: object = None  # the prompt with its images made into chunks off the engine thread (engine.vision)
    client: str = ""  # who sent it (its address): clients take turns for free slots
    tool_grammar: str | None = None  # the tools' grammar made off the engine thread (None: free text) ...
    grammar_for: int | None = None  # ... for this generation id; another generation makes it again
    id: int = field(default_factory=lambda: next_request_id())

"""The one event stream of a generation: what the engine thread makes for a request, what the bus
carries to the front door, and what every renderer (:mod:`hydrad.wire.render`) turns into a
client's answer.

A request's events are zero or more :class:`Progress` (prompt prefill, only when asked), zero or
more :class:`Token`, then exactly one :class:`Done` or :class:`Failed`. The engine's HTTP door
reads them from the engine thread's queue; the front door reads the same events decoded from
the bus (:mod:`hydrad.coordinator.answers`). Two error kinds, as in vLLM: a request failed (its own
fault or its limits; the engine is fine) and the engine failed (``engine_failed``: every caller
hears it, and the front door may retry elsewhere before the first token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hydrad.wire.logprobs import TokenLogprob
from hydrad.wire.toolcalls import ToolCall


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompt_ms: float
    predicted_ms: float
    queue_ms: float = 0.0  # waiting for a slot (or a loading model) before prefill started
    draft_n: int = 0  # speculative decoding: tokens drafted for it (llama-server's timings.draft_n)...
    draft_n_accepted: int = 0  # ... and of them accepted


@dataclass(frozen=True)
class Token:
    text: str
    ids: tuple[int, ...] = ()  # the tokens this text was made of, when the request asked (return_tokens)
    probs: tuple[TokenLogprob, ...] = ()  # their log-probabilities, when the request asked (logprobs)
    calls: tuple[ToolCall, ...] = ()  # tool calls completed by this text (then ``text`` is content only)
    reasoning: str = ""  # the model's thinking made with this text (hydrad.wire.reasoning), before it
    usage: Usage | None = None  # the request's timings so far, when it asked (timings_per_token)


@dataclass(frozen=True)
class Done:
    finish_reason: str
    usage: Usage
    fingerprint: str = ""  # the generation that served it (model + the parameters that built it)
    model: str = ""
    slot: int | None = None  # the slot that served it, whose KV now holds the turn...
    kv_tokens: int = 0  # ...this many tokens of it...
    kv_hash: str = ""  # ...with this digest (hydrad.wire.kvdigest), so a later reader can tell it is still there
    stop_word: str | None = None  # the stop string that ended it, if one did
    ids: tuple[int, ...] = ()  # generated tokens no Token carried yet (return_tokens)
    settings: Mapping[str, Any] | None = None  # the engine's values the request ran with (report_settings)
    truncated: bool = False  # the context filled: it was shifted (ctx_shift), or the generation ended there


@dataclass(frozen=True)
class Failed:
    message: str
    engine_failed: bool = False  # True: the engine, not the request, is at fault
    status: int = 500
    code: str = "engine_error"
    n_prompt_tokens: int | None = None  # a prompt longer than the context: its tokens and the context
    n_ctx: int | None = None
    param: str | None = None  # the request field at fault, when one is


@dataclass(frozen=True)
class Progress:
    """How far the prompt's prefill has got (llama-server's ``prompt_progress``): sent only to a
    request that asked (``return_progress``), once when it takes a slot and after each step that
    prefilled part of its prompt. ``processed`` counts the cached tokens too, up to ``total``."""

    total: int
    cache: int
    processed: int
    time_ms: int
    slot: int

    def body(self) -> dict[str, int]:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


Event = Token | Done | Failed | Progress

END = (Done, Failed)
"""The kinds that end a request's stream."""

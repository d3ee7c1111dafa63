"""What travels between the event loop and the engine thread: requests in, events out.

Two error kinds cross this boundary, as in vLLM: a request failed (the caller's fault or
its own limits; the engine is fine) and the engine failed (every caller gets it). The HTTP
plane turns both into OpenAI error JSON.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from hydrad.wire.logprobs import TokenLogprob
from hydrad.wire.requests import GenRequest
from hydrad.wire.toolcalls import ToolCall


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompt_ms: float
    predicted_ms: float
    queue_ms: float = 0.0  # waiting for a slot (or a loading model) before prefill started

    def openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True)
class GenerationTag:
    """Which generation (model + parameters that built it) served a request."""

    id: int
    model: str
    params_hash: str

    @property
    def fingerprint(self) -> str:
        return f"hydra-g{self.id}-{self.params_hash}"


@dataclass(frozen=True)
class Token:
    text: str
    ids: tuple[int, ...] = ()  # the tokens this text was made of, when the request asked (return_tokens)
    probs: tuple[TokenLogprob, ...] = ()  # their log-probabilities, when the request asked (logprobs)
    calls: tuple[ToolCall, ...] = ()  # tool calls completed by this text (then ``text`` is content only)


@dataclass(frozen=True)
class Done:
    finish_reason: str
    usage: Usage
    generation: GenerationTag
    slot: int | None = None  # the slot that served it, whose KV now holds the turn...
    kv_tokens: int = 0  # ...this many tokens of it...
    kv_hash: str = ""  # ...with this digest (hydrad.wire.kvdigest), so a later reader can tell it is still there
    stop_word: str | None = None  # the stop string that ended it, if one did
    ids: tuple[int, ...] = ()  # generated tokens no Token carried yet (return_tokens)


@dataclass(frozen=True)
class Failed:
    message: str
    engine_failed: bool = False  # True: the engine, not the request, is at fault
    status: int = 500
    code: str = "engine_error"
    n_prompt_tokens: int | None = None  # a prompt longer than the context: its tokens and the context
    n_ctx: int | None = None


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


class RequestHandle:
    """The event-loop side of a request: events arrive on an unbounded queue fed once per step."""

    def __init__(self, request: GenRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.finished = False
        self.t_enqueued = 0.0  # set by the engine thread when the request joins the wait queue
        self.generation: GenerationTag | None = None  # set by the engine thread when a slot takes the request
        self.t_submit = time.monotonic()
        self.t_first_token = 0.0  # engine thread: when the first token was sampled
        self.t_admitted = 0.0  # engine thread: when the request got its slot (its prefill can start)

    @property
    def id(self) -> int:
        return self.request.id

    async def events(self):
        while True:
            ev = await self.queue.get()
            yield ev
            if isinstance(ev, (Done, Failed)):
                self.finished = True
                return

"""What every renderer is: one request's answer in one dialect, built from the one event stream
(:mod:`hydrad.wire.events`) and nothing else.

A renderer is made per request with what its answer needs besides the events (an id, the model
name, what the request asked to see). Streams go ``head``, then ``piece``/``progress`` per event,
then ``end`` or ``broken``; a whole answer is ``whole`` of the pieces and the end. ``refusal`` is
the dialect's error body for a request refused before any answer. ``extra`` timings are what the
plane measured on the way (the engine's door adds where the time to the first token went).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from hydrad.wire.events import Done, Progress, Token, Usage
from hydrad.wire.openai import ApiError


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent ``data:`` event of ``obj``."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def timings(done: Done, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """llama-server's ``timings`` object for a finished request, with the plane's ``extra``."""
    return usage_timings(done.usage, extra)


def usage_timings(u: Usage, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """llama-server's ``timings`` of counts and times: at a request's end, or so far (each piece of a
    stream that asked for ``timings_per_token``)."""
    n_prompt = u.prompt_tokens - u.cached_tokens
    # as llama-server: the first token comes from the prompt's last batch, so the generation's rates are
    # over the steps after it (predicted_ms runs from the first token); 0 where nothing was timed
    steps = max(u.completion_tokens - 1, 0)
    timed = steps > 0 and u.predicted_ms > 0
    out = {"prompt_n": n_prompt, "prompt_ms": u.prompt_ms, "queue_ms": u.queue_ms,
           "prompt_per_token_ms": u.prompt_ms / n_prompt if n_prompt > 0 else 0.0,
           "prompt_per_second": 1e3 / u.prompt_ms * n_prompt if u.prompt_ms > 0 else 0.0,
           "predicted_n": u.completion_tokens, "predicted_ms": u.predicted_ms, "cache_n": u.cached_tokens,
           "predicted_per_token_ms": u.predicted_ms / steps if timed else 0.0,
           "predicted_per_second": 1e3 / u.predicted_ms * steps if timed else 0.0}
    if u.draft_n:  # as llama-server: only when speculative decoding drafted for it
        out.update(draft_n=u.draft_n, draft_n_accepted=u.draft_n_accepted)
    if extra:
        out.update(extra)
    return out


class Renderer:
    """One dialect's answer for one request (see the module docstring)."""

    dialect: ClassVar[str]
    """The name the registry (:data:`hydrad.wire.render.RENDERERS`) knows it by."""

    def head(self) -> bytes:
        """What a stream starts with, before the first event."""
        return b""

    def piece(self, ev: Token) -> bytes:
        raise NotImplementedError

    def progress(self, ev: Progress) -> bytes:
        """A prefill progress event (only a request that asked gets them)."""
        return b""

    def end(self, done: Done, extra: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def broken(self, err: ApiError) -> bytes:
        """The end of a stream that failed after it began."""
        raise NotImplementedError

    def whole(self, pieces: list[Token], done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def refusal(err: ApiError) -> dict[str, Any]:
        """The error body of a request refused before any answer."""
        return err.body()

"""The front door's replies: an engine's bus events (TOKENS, DONE, ERROR, a lost engine) turned
into one OpenAI response or a stream of OpenAI chunks.

Failure rules after the first token (see ``frontdoor``): a stream ends with an OpenAI error
event and ``data: [DONE]``; a non-streaming request raises :class:`Lost` when its engine
failed (the front door may retry it), else an ApiError (502, 504 or the engine's own).
Whichever way a reply ends, a request still running on its engine is cancelled there.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator, Callable

from starlette.responses import JSONResponse, Response

from hydrad.common.logs import log_event
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.records import EngineLost, RequestStream
from hydrad.wire import logprobs as lp
from hydrad.wire import messages as M
from hydrad.wire import openai, toolcalls
from hydrad.wire.openai import ApiError, overflow_details

log = logging.getLogger("hydra.coordinator")


class Lost(Exception):
    """A non-streaming request's engine failed part-way; nothing reached the client yet."""


class Turn:
    """What a finished turn needs for its response and for affinity."""

    __slots__ = ("kind", "rid", "model", "engine", "session", "messages", "include_usage")

    def __init__(self, *, kind: str, rid: str, model: str, engine: str, session: str | None,
                 messages: list[dict[str, str]] | None, include_usage: bool) -> None:
        self.kind, self.rid, self.model, self.engine = kind, rid, model, engine
        self.session, self.messages, self.include_usage = session, messages, include_usage


def timings(usage: M.UsageInfo) -> dict[str, Any]:
    return {"prompt_n": usage.prompt_tokens - usage.cached_tokens, "prompt_ms": usage.prompt_ms,
            "predicted_n": usage.completion_tokens, "predicted_ms": usage.predicted_ms, "cache_n": usage.cached_tokens,
            "predicted_per_second": round(usage.completion_tokens / (usage.predicted_ms / 1000), 2)
            if usage.predicted_ms else None}


def api_error(ev: M.Error) -> ApiError:
    """An engine's ERROR as the client gets it, with llama-server's numbers of a prompt that does not
    fit the context when the engine sent them."""
    return ApiError(ev.status, ev.message, ev.code, details=overflow_details(ev.n_prompt_tokens, ev.n_ctx))


def _probs(ev: M.Tokens) -> list[lp.TokenLogprob]:
    return [p.token() for p in ev.logprobs or ()]


def _calls(ev: M.Tokens) -> list[toolcalls.ToolCall]:
    return [c.call() for c in ev.tool_calls or ()]


async def collect(bus: CoordinatorBus, token_timeout_s: float, turn: Turn, stream: RequestStream, first: Any,
                  headers: dict[str, str], record: Callable[[Turn, str, M.Done], None]) -> Response:
    """The whole answer of a non-streaming request."""
    texts: list[str] = []
    probs: list[lp.TokenLogprob] = []
    calls: list[toolcalls.ToolCall] = []
    ev = first
    try:
        while True:
            if isinstance(ev, M.Tokens):
                texts.extend(ev.texts)
                probs.extend(_probs(ev))
                calls.extend(_calls(ev))
            elif isinstance(ev, M.Done):
                text = "".join(texts)
                record(turn, text, ev)
                rendered = None if stream.logprobs is None else lp.render(turn.kind, probs)
                body = openai.full_response(turn.kind, turn.rid, turn.model, text, ev.finish_reason, ev.usage.openai(),
                                            ev.fingerprint, timings(ev.usage), rendered, calls)
                return JSONResponse(body, headers={**headers, "X-Hydra-Generation": ev.fingerprint})
            elif isinstance(ev, EngineLost):
                # Lost after it started generating: the request itself may be what killed it,
                # so it is not tried on a second engine.
                raise ApiError(502, f"engine {turn.engine} failed during the request ({ev.reason})",
                               "engine_failed")
            elif isinstance(ev, M.Error):
                if ev.engine_failed:
                    raise Lost(f"engine {turn.engine} failed during the request: {ev.message}")
                raise api_error(ev)
            ev = await stream.next(token_timeout_s)
            if ev is None:
                raise ApiError(504, f"engine {turn.engine} sent nothing for {token_timeout_s:g} s", "timeout")
    finally:
        if not stream.finished:
            bus.cancel(stream)


async def relay(bus: CoordinatorBus, token_timeout_s: float, turn: Turn, stream: RequestStream, first: Any,
                fingerprint: Callable[[], str], record: Callable[[Turn, str, M.Done], None]) -> AsyncIterator[bytes]:
    """A streaming request's answer, as server-sent events.

    Events already waiting in the stream go out in one write: each write is a send on the client's
    socket, and when the reader has fallen behind, one send per token is what keeps it behind."""
    created = int(time.time())
    fp = fingerprint()
    k, rid, model = turn.kind, turn.rid, turn.model
    texts: list[str] = []
    offsets = None if stream.logprobs is None else lp.TextOffsets()
    n_calls = 0
    out: list[bytes] = []
    try:
        if k == "chat":
            out.append(openai.chunk(k, rid, model, created, "", None, fp, first=True))
        ev = first
        while True:
            if isinstance(ev, M.Tokens):
                text = "".join(ev.texts)
                texts.append(text)
                probs = None if offsets is None else lp.render(k, _probs(ev), offsets)
                calls = _calls(ev)
                out.append(openai.chunk(k, rid, model, created, text, None, fp, logprobs=probs,
                                        calls=toolcalls.delta(calls, n_calls)))
                n_calls += len(calls)
            elif isinstance(ev, M.Done):
                fp = ev.fingerprint or fp
                out.append(openai.chunk(k, rid, model, created, None, ev.finish_reason, fp))
                if turn.include_usage:
                    out.append(openai.usage_chunk(k, rid, model, created, ev.usage.openai(), fp))
                out.append(openai.DONE)
                yield b"".join(out)
                record(turn, "".join(texts), ev)
                return
            elif isinstance(ev, M.Error):
                yield b"".join((*out, openai.sse(api_error(ev).body()), openai.DONE))
                return
            elif isinstance(ev, EngineLost):
                log_event(log, logging.WARNING, "engine failed mid-stream", req=rid, engine=turn.engine, error=ev.reason)
                yield b"".join((*out, openai.sse(ApiError(502, f"engine {turn.engine} failed mid-stream: {ev.reason}",
                                                          "engine_failed").body()), openai.DONE))
                return
            if out and not stream.ready():
                yield b"".join(out)
                out = []
            ev = await stream.next(token_timeout_s)
            if ev is None:
                log_event(log, logging.WARNING, "engine went silent mid-stream", req=rid, engine=turn.engine)
                yield b"".join((*out, openai.sse(ApiError(504, f"engine {turn.engine} sent nothing for "
                                                              f"{token_timeout_s:g} s", "timeout").body()), openai.DONE))
                return
    except Exception as exc:  # headers are out: a bug here must still end the stream properly
        log_event(log, logging.ERROR, "stream failed", req=rid, error=repr(exc), exc_info=True)
        yield b"".join((*out, openai.sse(ApiError(500, "internal error (see the coordinator log)",
                                                  "internal_error").body()), openai.DONE))
    finally:
        if not stream.finished:
            bus.cancel(stream)

"""OpenAI's answers: ``/v1/chat/completions`` (``chat.completion`` and its chunks) and
``/v1/completions`` (``text_completion``), whole or as server-sent events ending in
``data: [DONE]``, with llama-server's ``timings`` on the whole answer and the last chunk, and a chat's
thinking as llama-server's ``reasoning_content`` (``delta.reasoning_content`` in a stream)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from hydrad.wire import logprobs as lp
from hydrad.wire import toolcalls
from hydrad.wire.events import Done, Progress, Token, Usage
from hydrad.wire.openai import ApiError
from hydrad.wire.render.base import Renderer, sse, timings, usage_timings
from hydrad.wire.toolcalls import ToolCall

DONE = b"data: [DONE]\n\n"


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def full_response(kind: str, rid: str, model: str, text: str, finish: str, usage_: dict[str, Any],
                  fingerprint: str, timings_: dict[str, Any], logprobs: dict[str, Any] | None = None,
                  calls: list[ToolCall] | None = None, reasoning: str = "", index: int = 0) -> dict[str, Any]:
    """A whole answer; ``logprobs`` is its choice's (:func:`hydrad.wire.logprobs.render`), null when
    the request asked for none. An answer that made ``calls`` has them in ``message.tool_calls``
    and, as OpenAI's, a null content unless the model also wrote text. The model's thinking, when
    it was split off, is ``message.reasoning_content`` (llama-server's field), absent otherwise."""
    created = int(time.time())
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message = {"role": "assistant", "content": text.strip() or None,
                       "tool_calls": [c.openai() for c in calls]}
        if reasoning:
            message["reasoning_content"] = reasoning
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
        obj = "chat.completion"
    else:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": fingerprint,
            "choices": [choice], "usage": usage_, "timings": timings_}


def chunk(kind: str, rid: str, model: str, created: int, text: str | None, finish: str | None,
          fingerprint: str, first: bool = False, timings_: dict[str, Any] | None = None,
          logprobs: dict[str, Any] | None = None, calls: list[dict[str, Any]] | None = None, index: int = 0) -> bytes:
    """SSE for one step of an answer; ``logprobs`` are those of the tokens whose text it carries.
    ``calls`` are ``delta.tool_calls`` entries (:func:`hydrad.wire.toolcalls.delta`), each in a
    chunk of its own as OpenAI streams them, after the text's chunk (none when the step made only
    calls)."""
    if not calls:
        return _chunk(kind, rid, model, created, {"content": text}, finish, fingerprint, first, timings_, logprobs,
                      index)
    head = _chunk(kind, rid, model, created, {"content": text}, None, fingerprint, first, None, logprobs,
                  index) if text else b""
    return head + b"".join(_chunk(kind, rid, model, created, {"tool_calls": [c]}, None, fingerprint,
                                  logprobs=None if text or i else logprobs, index=index,
                                  timings_=timings_ if i == len(calls) - 1 else None) for i, c in enumerate(calls))


def _chunk(kind: str, rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None,
           fingerprint: str, first: bool = False, timings_: dict[str, Any] | None = None,
           logprobs: dict[str, Any] | None = None, index: int = 0, extra: dict[str, Any] | None = None) -> bytes:
    text = delta.get("content")
    if kind == "chat":
        delta = {k: v for k, v in delta.items() if v is not None}
        if first:  # the role alone, content null, as llama-server's stream opens
            delta = {"role": "assistant", "content": None, **delta}
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": fingerprint,
            "choices": [choice]}
    if timings_ is not None:  # the last chunk carries them, as llama-server's does (every one: timings_per_token)
        body["timings"] = timings_
    return sse({**body, **(extra or {})})


def usage_chunk(kind: str, rid: str, model: str, created: int, usage_: dict[str, Any], fingerprint: str) -> bytes:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return sse({"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": fingerprint,
                "choices": [], "usage": usage_})


class _OpenAI(Renderer):
    """``index``: the choice this renderer answers, of a request for ``n`` of them (each choice has
    a renderer of its own, all with the one ``rid``; see :func:`hydrad.wire.answering.stream_choices`)."""

    kind: str

    def __init__(self, model: str, fingerprint: str = "", *, include_usage: bool = False, logprobs: bool = False,
                 rid: str | None = None, index: int = 0, post: bool = False) -> None:
        self.rid = rid or new_id(self.kind)
        self.index = index
        self.model, self.fingerprint, self.include_usage = model, fingerprint, include_usage
        self.created = int(time.time())
        self.offsets = lp.TextOffsets() if logprobs else None
        self.logprobs = logprobs
        self.post = post  # log-probabilities are post-sampling probabilities (llama-server's post_sampling_probs)
        self.n_calls = 0

    def head(self) -> bytes:
        if self.kind != "chat":
            return b""
        return chunk(self.kind, self.rid, self.model, self.created, None, None, self.fingerprint, first=True,
                     index=self.index)

    def progress(self, ev: Progress) -> bytes:
        """llama-server's progress chunk: the opening delta (the role, or an empty text) with ``prompt_progress``."""
        return _chunk(self.kind, self.rid, self.model, self.created, {"content": None}, None, self.fingerprint,
                      first=True, index=self.index, extra={"prompt_progress": ev.body()})

    def piece(self, ev: Token) -> bytes:
        probs = None if self.offsets is None else lp.render(self.kind, ev.probs, self.offsets, self.post)
        so_far = None if ev.usage is None else usage_timings(ev.usage)  # timings_per_token: on the piece's last chunk
        out = b""
        if ev.reasoning:  # thinking comes before the text it was made with: a chunk of its own
            only = not ev.text and not ev.calls
            out = _chunk(self.kind, self.rid, self.model, self.created, {"reasoning_content": ev.reasoning}, None,
                         self.fingerprint, logprobs=probs, index=self.index, timings_=so_far if only else None)
            probs = None
            if only:
                return out
        out += chunk(self.kind, self.rid, self.model, self.created, ev.text, None, self.fingerprint, logprobs=probs,
                     calls=toolcalls.delta(list(ev.calls), self.n_calls), index=self.index, timings_=so_far)
        self.n_calls += len(ev.calls)
        return out

    def end(self, done: Done, extra: dict[str, Any]) -> bytes:
        return self.end_choice(done, extra) + self.tail(usage(done.usage), done.fingerprint)

    def end_choice(self, done: Done, extra: dict[str, Any]) -> bytes:
        """This choice's last chunk (its finish reason and timings)."""
        return chunk(self.kind, self.rid, self.model, self.created, None, done.finish_reason,
                     done.fingerprint or self.fingerprint, timings_=timings(done, extra), index=self.index)

    def tail(self, usage_: dict[str, Any], fingerprint: str = "") -> bytes:
        """The end of the whole stream, after every choice's last chunk: the usage, when asked, and [DONE]."""
        out = b""
        if self.include_usage:
            out = usage_chunk(self.kind, self.rid, self.model, self.created, usage_, fingerprint or self.fingerprint)
        return out + DONE

    def broken(self, err: ApiError) -> bytes:
        return sse(err.body()) + DONE

    def whole(self, pieces: list[Token], done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        probs = lp.render(self.kind, [p for t in pieces for p in t.probs], post=self.post) if self.logprobs else None
        return full_response(self.kind, self.rid, self.model, "".join(t.text for t in pieces), done.finish_reason,
                             usage(done.usage), done.fingerprint or self.fingerprint, timings(done, extra), probs,
                             [c for t in pieces for c in t.calls], "".join(t.reasoning for t in pieces), self.index)


class ChatAnswer(_OpenAI):
    dialect = "openai.chat"
    kind = "chat"


class CompletionAnswer(_OpenAI):
    dialect = "openai.completion"
    kind = "completion"

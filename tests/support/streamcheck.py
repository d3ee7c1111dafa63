"""Read one OpenAI stream the way a strict client would, and say what the client saw.

A fault must leave every client with one of two things: a complete answer (possibly retried on
another engine) or a clean error (an HTTP error with OpenAI error JSON, or an error event followed by
``data: [DONE]``). The bad outcomes are a hang (nothing within the client's budget) and a garbled
stream (a line that is not an SSE event of JSON, no ``[DONE]``, anything after it, or a connection
that drops mid-stream). :func:`stream_chat` reads the raw bytes, so the framing a client library
would hide is checked too."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

COMPLETE, ERROR, HANG, GARBLED, DROPPED = "complete", "clean_error", "hang", "garbled", "dropped"


@dataclass
class Outcome:
    kind: str
    status: int = 0
    engine: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    ttft: float | None = None
    detail: str = ""
    error_code: str | None = None
    lines: list[str] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """What the promise allows: a complete answer or a clean error."""
        return self.kind in (COMPLETE, ERROR)


def _json_error(body: bytes) -> str | None:
    try:
        err = json.loads(body)["error"]
        return str(err.get("code") or err.get("type") or "error") if err.get("message") else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def check_lines(lines: list[str]) -> tuple[str, str, str | None, int]:
    """(kind, detail, error code, content chunks) of a whole SSE body's lines."""
    datas: list[str] = []
    for line in lines:
        if line.startswith("data: "):
            datas.append(line[6:])
        elif line and not line.startswith(":"):
            return GARBLED, f"not an SSE data line: {line[:120]!r}", None, 0
    if not datas or datas[-1] != "[DONE]":
        return GARBLED, f"no [DONE] at the end ({len(datas)} events)", None, 0
    if datas.count("[DONE]") != 1:
        return GARBLED, "[DONE] twice", None, 0
    chunks, finished, code, message = 0, False, None, ""
    for d in datas[:-1]:
        try:
            ev = json.loads(d)
        except ValueError:
            return GARBLED, f"event is not JSON: {d[:120]!r}", None, 0
        if "error" in ev:
            err = ev["error"]
            if not isinstance(err, dict) or not err.get("message"):
                return GARBLED, f"error event without a message: {d[:200]}", None, 0
            if d is not datas[-2]:
                return GARBLED, "events after an error event", None, 0
            code = str(err.get("code") or err.get("type"))
            message = str(err.get("message"))[:300]
            continue
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                chunks += 1
            if ch.get("finish_reason"):
                finished = True
    if code is not None:
        return ERROR, f"error event after {chunks} chunks, then [DONE]: {message}", code, chunks
    if not finished:
        return GARBLED, "[DONE] without a finish_reason", None, chunks
    return COMPLETE, "", None, chunks


def stream_chat(base_url: str, body: dict[str, Any], budget: float = 60.0,
                on_chunk: Callable[[int, str | None], None] | None = None,
                on_headers: Callable[[str | None], None] | None = None) -> Outcome:
    """POST a streaming chat to ``base_url`` and classify what comes back within ``budget`` seconds.

    ``on_headers(engine)`` runs once the response headers arrive; ``on_chunk(n, engine)`` after the
    n-th content chunk (a test kills something there)."""
    t0 = time.monotonic()
    out = Outcome(kind=HANG)
    timeout = httpx.Timeout(budget, connect=10)
    try:
        with httpx.Client(timeout=timeout) as http, \
                http.stream("POST", base_url + "/v1/chat/completions", json={**body, "stream": True}) as r:
            out.status = r.status_code
            out.engine = r.headers.get("x-hydra-engine")
            if on_headers is not None:
                on_headers(out.engine)
            if r.status_code != 200:
                raw = r.read()
                out.error_code = _json_error(raw)
                out.kind, out.detail = (ERROR, f"HTTP {r.status_code}") if out.error_code else \
                    (GARBLED, f"HTTP {r.status_code} without OpenAI error JSON: {raw[:200]!r}")
                return out
            n = 0
            for line in r.iter_lines():
                out.lines.append(line)
                if line.startswith("data: {") and '"content"' in line and '"error"' not in line:
                    n += 1
                    if out.ttft is None:
                        out.ttft = time.monotonic() - t0
                    if on_chunk is not None:
                        on_chunk(n, out.engine)
                if time.monotonic() - t0 > budget:
                    out.kind, out.detail = HANG, f"still streaming after {budget:.0f}s"
                    return out
        out.kind, out.detail, out.error_code, out.tokens = check_lines(out.lines)
    except httpx.TimeoutException as exc:
        out.kind, out.detail = HANG, f"{type(exc).__name__} after {time.monotonic() - t0:.1f}s"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        out.kind, out.detail = DROPPED, f"{type(exc).__name__}: {exc}"
    except httpx.ConnectError as exc:
        out.kind, out.detail = ERROR, f"refused: {exc}"
        out.error_code = "connect"
    finally:
        out.seconds = time.monotonic() - t0
    return out


def chat_once(base_url: str, body: dict[str, Any], budget: float = 60.0) -> tuple[int, float]:
    """A non-streaming chat: (status, seconds). Status 0: no answer within ``budget``."""
    t0 = time.monotonic()
    try:
        r = httpx.post(base_url + "/v1/chat/completions", json={**body, "stream": False}, timeout=budget)
        return r.status_code, time.monotonic() - t0
    except httpx.HTTPError:
        return 0, time.monotonic() - t0

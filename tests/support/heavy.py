"""Big but legal requests, and a steady stream that times its own token gaps while they are served.

Each heavy request is one a real client may send: an agent's 128 tools, a long chat, a JSON
schema with a huge repetition count. None may stall anyone else's stream; each must get an
answer or a clear 4xx.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def tool(i: int) -> dict[str, Any]:
    """An ordinary tool, as an MCP server describes one."""
    return {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Does task {i} with the given inputs.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "count": {"type": "integer"}, "mode": {"enum": ["fast", "slow"]},
            "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["path"]}}}


def heavy_bodies(model: str | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
    """name → (path, body) of the heavy requests."""
    hi = [{"role": "user", "content": "Hi"}]
    base: dict[str, Any] = {"model": model} if model else {}
    return {
        "min_items_1e8": ("/v1/chat/completions", {**base, "messages": hi, "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "xs", "schema": {
                "type": "array", "items": {"type": "integer"}, "minItems": 100_000_000}}}}),
        "tools_128": ("/v1/chat/completions", {**base, "messages": hi, "max_tokens": 8,
                                                "tools": [tool(i) for i in range(128)], "tool_choice": "required"}),
        "messages_40000": ("/v1/chat/completions", {**base, "messages": [{"role": "user", "content": ""}] * 40_000,
                                                     "max_tokens": 8}),
    }


@dataclass
class Answer:
    name: str
    status: int = 0
    code: str | None = None
    seconds: float = 0.0
    error: str = ""


@dataclass
class SteadyStream:
    """Streams one chat completion after another until stopped, keeping the longest gap between two
    arrivals (the first token counts from the request's start) and any failure."""

    url: str
    body: dict[str, Any]
    gaps: list[float] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                t0 = last = time.monotonic()
                first = True
                try:
                    with client.stream("POST", self.url, json={**self.body, "stream": True}) as r:
                        if r.status_code != 200:
                            self.failures.append(f"{r.status_code}: {r.read()[:200]!r}")
                            continue
                        for line in r.iter_lines():
                            if not line.startswith("data: "):
                                continue
                            now = time.monotonic()
                            if first:
                                self.first_tokens.append(now - t0)
                                first = False
                            else:
                                self.gaps.append(now - last)
                            last = now
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


def send(base_url: str, name: str, path: str, body: dict[str, Any], timeout: float = 60.0) -> Answer:
    raw = json.dumps(body).encode()
    t0 = time.monotonic()
    try:
        r = httpx.post(base_url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=timeout)
    except httpx.HTTPError as exc:
        return Answer(name, 0, None, time.monotonic() - t0, repr(exc))
    code = None
    if r.status_code != 200:
        try:
            code = r.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
    return Answer(name, r.status_code, code, time.monotonic() - t0, "" if r.status_code == 200 else r.text[:300])

"""Big but legal requests, and a steady stream that times its own token gaps while they are served.

Each heavy request is one a real client may send: an agent's 128 tools, a long chat, a JSON
schema with a huge repetition count. None may stall anyone else's stream; each must get an
answer or a clear 4xx.
"""

from __future__ import annotations

import json
import multiprocessing
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


GROWING = 'root ::= r\nr ::= "a" r "b" | "a" r "c" | "a" tail\ntail ::= "a"{30} "z"'
"""A grammar whose ambiguity doubles llama.cpp's work with every token: only running it can tell."""


def properties_6500() -> dict[str, Any]:
    """A 6,500-property schema, as a generated API client may send it (76 KB as compact JSON)."""
    return {"type": "object", "properties": {f"prop{i}": {} for i in range(6500)}}


def heavy_bodies(model: str | None = None, all_kinds: bool = False) -> dict[str, tuple[str, dict[str, Any]]]:
    """name → (path, body) of the heavy requests (``all_kinds``: also the 8 MiB ones and 26 grammars)."""
    hi = [{"role": "user", "content": "Hi"}]
    base: dict[str, Any] = {"model": model} if model else {}
    more: dict[str, tuple[str, dict[str, Any]]] = {}
    if all_kinds:
        more["properties_6500"] = ("/v1/chat/completions", {**base, "messages": hi, "max_tokens": 8,
                                                             "json_schema": properties_6500()})
        more["tokenize_8mib_pieces"] = ("/tokenize", {**base, "content": "word " * ((8 << 20) // 5 - 64),
                                                      "with_pieces": True})
        more["token_ids_4m"] = ("/completion", {**base, "prompt": [1] * 4_000_000, "n_predict": 1})
        for i in range(26):
            more[f"growing_grammar_{i}"] = ("/v1/completions", {**base, "prompt": "Say a", "grammar": GROWING,
                                                                "max_tokens": 48, "temperature": 0})
    return {**more,
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


STEADY_ADDRESS = "127.0.0.2"
"""The steady clients connect from an address of their own: a pool tells clients apart by address."""


def _stream_forever(url: str, body: dict[str, Any], stop: Any, out: Any) -> None:
    """The steady client's loop, in a process of its own: the test process sending megabytes of heavy
    requests must not stall the clock of the client it measures."""
    gaps: list[float] = []
    firsts: list[float] = []
    failures: list[str] = []
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=STEADY_ADDRESS)) as client:
        while not stop.is_set():
            t0 = last = time.monotonic()
            first = True
            try:
                with client.stream("POST", url, json={**body, "stream": True}) as r:
                    if r.status_code != 200:
                        failures.append(f"{r.status_code}: {r.read()[:200]!r}")
                        continue
                    for line in r.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        now = time.monotonic()
                        if first:
                            firsts.append(now - t0)
                            first = False
                        else:
                            gaps.append(now - last)
                        last = now
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
    out.send((gaps, firsts, failures))


@dataclass
class SteadyStream:
    """Streams one chat completion after another in a child process until stopped, keeping every gap
    between two arrivals, every time to a first token, and any failure."""

    url: str
    body: dict[str, Any]
    gaps: list[float] = field(default_factory=list)
    first_tokens: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def start(self) -> "SteadyStream":
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_stream_forever, args=(self.url, self.body, self._stop, send), daemon=True)
        self._proc.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._recv.poll(90):
            self.gaps, self.first_tokens, self.failures = self._recv.recv()
        else:
            self.failures.append("the steady client did not report within 90 s")
        self._proc.join(10)


def encoded(bodies: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, tuple[str, bytes]]:
    """The bodies as compact JSON, made before the clock starts."""
    return {name: (path, json.dumps(body, separators=(",", ":")).encode()) for name, (path, body) in bodies.items()}


def send(base_url: str, name: str, path: str, raw: bytes, timeout: float = 60.0) -> Answer:
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

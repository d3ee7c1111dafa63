"""The request stream beside the bus (``bus.request_stream``, hydrad/coordinator/reqstream.py), on a
real coordinator and a real SmolLM2 engine: requests go over it and answer as they would straight
from the engine; strangers on its port are closed without touching the pool; a coordinator restart
ends it and the engine opens a new one."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.conftest import start_solo_pool
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine
from tests.support.wait import eventually
from hydrad.common.netaccess import split_endpoint
from hydrad.coordinator import reqstream
from hydrad.wire import streamframes as SF

pytestmark = pytest.mark.model


@pytest.fixture
def stream_pool(tmp_path: Path, smollm_path: Path,
                start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    c, e = start_solo_pool(tmp_path, start_engine, request_stream=True)
    yield c, e
    c.stop()


def stream_health(c: Coordinator) -> dict[str, Any]:
    return c.http.get("/health").json()["request_stream"]


def stream_up(c: Coordinator) -> dict[str, Any]:
    return eventually(lambda: (h := stream_health(c))["engines"] == ["solo"] and h, 20, "the engine's request stream")


def sse_text(body: str) -> str:
    out = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def test_requests_go_over_the_stream_and_answer_as_the_engine_does(stream_pool: tuple[Coordinator, Engine]) -> None:
    c, e = stream_pool
    before = stream_up(c)
    assert before["opened"] == 1 and before["endpoint"] == c.request_stream
    comp = {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
    chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 12, "temperature": 0}
    for path, body, text in (("/v1/completions", comp, lambda j: j["choices"][0]["text"]),
                             ("/v1/chat/completions", chat, lambda j: j["choices"][0]["message"]["content"])):
        through, direct = c.http.post(path, json=body), e.http.post(path, json=body)
        assert through.status_code == direct.status_code == 200, through.text
        assert text(through.json()) == text(direct.json()) != ""
        streamed = c.http.post(path, json={**body, "stream": True})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert sse_text(streamed.text) == text(direct.json())
    after = stream_health(c)
    assert after["sent"] >= before["sent"] + 4 and after["received"] >= before["received"] + 4  # each way, each request
    assert after["lost"] == 0 and after["refused"] == 0


def _closed(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        while s.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_strangers_on_the_stream_port_are_closed_and_the_pool_serves_on(
        stream_pool: tuple[Coordinator, Engine]) -> None:
    c, _ = stream_pool
    stream_up(c)
    host, port = split_endpoint(c.request_stream or "")
    cases = {
        "junk": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "a length over the HELLO limit": struct.pack("<I", 1 << 31),
        "a forged identity": SF.pack([b"HELLO", b"solo~" + b"0" * 32, b""]),
        "not a HELLO": SF.pack([b"hydra-bus/2", b"TOKENS", b"{}"]),
    }
    for name, data in cases.items():
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(data)
            assert _closed(s, 5), name
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=5) as silent:  # says nothing: closed at the deadline
        assert _closed(silent, 10) and time.monotonic() - t0 < 9
    assert stream_health(c)["refused"] == len(cases) + 1
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(reqstream.MAX_PENDING)]
    try:
        time.sleep(0.3)
        with socket.create_connection((host, port), timeout=5) as extra:  # one too many owing a HELLO
            assert _closed(extra, 2)
    finally:
        for s in idle:
            s.close()
    h = eventually(lambda: (h := stream_health(c))["refused"] >= len(cases) + 2 + reqstream.MAX_PENDING and h, 10,
                   "the idle connections closed")
    assert h["engines"] == ["solo"] and h["lost"] == 0
    r = c.http.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert "Traceback" not in c.log()


def test_a_coordinator_restart_ends_the_stream_and_the_engine_opens_a_new_one(
        stream_pool: tuple[Coordinator, Engine]) -> None:
    c, e = stream_pool
    stream_up(c)
    c.kill()
    c.start_again()
    c.wait_ready()
    h = stream_up(c)
    assert h["opened"] == 1  # the new coordinator's count
    eventually(lambda: e.log().count("request stream open") >= 2, 10, "the engine's second stream")
    with httpx.Client(base_url=c.url, timeout=60) as client:
        r = client.post("/v1/completions", json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 4,
                                                 "temperature": 0})
    assert r.status_code == 200, r.text
    assert stream_health(c)["received"] >= 1

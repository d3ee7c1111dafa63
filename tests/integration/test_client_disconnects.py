"""A client that goes away, in the middle of its request's body or of its answer, is logged at INFO
without a traceback at both doors and is never counted as a 500. Real daemons, raw sockets."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Callable

from tests.conftest import start_solo_pool
from tests.support.engine import Engine
from tests.support.wait import eventually

CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 1500,
        "ignore_eos": True}  # a minute of generation here: only a cancellation frees the slot soon
BODIES = {"/v1/chat/completions": CHAT, "/completion": {"prompt": "Once upon a time", "n_predict": 1500,
                                                        "ignore_eos": True},
          "/v1/messages": CHAT, "/tokenize": {"content": "hello " * 50},
          "/apply-template": {"messages": CHAT["messages"]}}


def _send(port: int, path: str, body: dict, cut: int | None = None) -> socket.socket:
    raw = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\n\r\n".encode() + (raw if cut is None else raw[:cut]))
    return s


def test_disconnects_mid_body_and_mid_answer_are_info_never_errors(tmp_path: Path, smollm_path: Path,
                                                                    start_engine: Callable[..., Engine]) -> None:
    c, e = start_solo_pool(tmp_path, start_engine)
    try:
        for port in (e.port, c.port):
            for path, body in BODIES.items():
                s = _send(port, path, body, cut=12)  # the body stops after 12 bytes, and the client leaves
                time.sleep(0.2)
                s.close()
            for path in ("/v1/chat/completions", "/completion", "/v1/messages"):
                s = _send(port, path, {**BODIES[path], "stream": True})
                assert s.recv(64)  # the answer has begun
                s.close()
                s = _send(port, path, BODIES[path])  # not streamed: left while it generates
                time.sleep(0.5)
                s.close()
        for log in (e.log, c.log):
            eventually(lambda log=log: log().count("client disconnected before its request body was complete")
                       >= len(BODIES), 10, "every body cut logged", context=log)
        eventually(lambda: not any(s["is_processing"] for s in e.http.get("/slots").json()), 15,
                   "every answer left cancelled (no slot busy)", context=e.log)
        eventually(lambda: c.http.get("/admin/engines").json()["engines"][0]["inflight"] == 0, 15,
                   "nothing in flight at the coordinator")
        assert "client disconnected; request cancelled" in e.log()
        for name, log in (("engine", e.log()), ("coordinator", c.log())):
            assert "level=error" not in log and "Traceback" not in log and "Exception in ASGI" not in log, (name, log)
            assert "client disconnected before its request body was complete" in log
        metrics = c.http.get("/metrics").text
        assert 'status="500"' not in metrics and "hydra_coordinator_requests" in metrics
        r = c.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        c.stop()

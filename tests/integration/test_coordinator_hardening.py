"""The coordinator against what an outside probe of a stock pool did to it: real hydrad engines,
a real hydra-coordinator process, real ZeroMQ, real models.

- a request that fails on its engine is not retried onto the next one (only engine failures are);
- requests the bus cannot carry (a lone surrogate, more than the engines accept) leave nothing
  in flight and knock no engine off the bus; over-large bodies get 413 before they are read;
- a client that goes away cancels its request on the engine (streaming or not);
- a request for a dead engine's model does not evict another engine's profile model, and the
  restarted engine gets its profile back;
- /admin is gated by address and bearer token; the bus by the pool's token; session ids are checked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import zmq

from hydrad.wire import messages as M
from hydrad.engine import faults
from tests.support.coordinator import Coordinator
from tests.support.engine import REPO, Engine

pytestmark = pytest.mark.model

INTERVAL = 0.5
DEV_PROFILES = REPO / "etc" / "hydra" / "dev" / "profiles.yaml"
DEV = {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}
TWIN_PROFILES = {
    "profiles": {"twin": {"engines": {n: {"model": "smollm2-135m", "params": {"n_parallel": 2, "n_ctx": 2048}}
                                      for n in ("dev-a", "dev-b")}}},
    "default": "twin",
}
TWIN = {"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"}


class Pool:
    def __init__(self, c: Coordinator, start_engine: Callable[..., Engine], env: dict[str, str] | None) -> None:
        self.c = c
        self._start = start_engine
        self._env = env
        self.engines: dict[str, Engine] = {}

    def engine(self, name: str) -> Engine:
        e = self._start(name=name, defaults={"n_ctx": 2048, "n_parallel": 2, "n_threads": 1},
                        extra={"bus": self.c.engine_bus(heartbeat_interval_s=INTERVAL)}, env=self._env)
        self.engines[name] = e
        return e

    def busy_slots(self, name: str) -> int:
        return sum(1 for s in self.engines[name].http.get("/slots").json() if s["is_processing"])


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, gemma_path: Path,
         start_engine: Callable[..., Engine]) -> Iterator[Callable[..., Pool]]:
    started: list[Coordinator] = []

    def make(profiles: Any = DEV_PROFILES, engines: tuple[str, ...] = ("dev-a", "dev-b"),
             engine_env: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> Pool:
        c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=INTERVAL, extra=extra)
        started.append(c)
        c.wait_ready()
        p = Pool(c, start_engine, engine_env)
        for name in engines:
            p.engine(name)
        return p

    yield make
    for c in started:
        c.stop()


def _chat(c: Coordinator, model: str, text: str = "hi", **extra: Any) -> httpx.Response:
    return c.http.post("/v1/chat/completions", json={"model": model, "max_tokens": 4, "temperature": 0,
                                                     "messages": [{"role": "user", "content": text}], **extra})


def _routes(c: Coordinator, req: str) -> list[dict[str, Any]]:
    return [ev["data"] for ev in c.events.of("route") if ev["data"]["req"] == req]


# ----- 1. retry policy ------------------------------------------------------------------------


def test_a_request_that_fails_on_its_engine_is_not_retried_elsewhere(pool: Callable[..., Pool]) -> None:
    p = pool(profiles=TWIN_PROFILES, engine_env={faults.ENV: "1"})
    c = p.c
    c.wait_serving(TWIN)
    r = _chat(c, "smollm2-135m", f"Say hi. {faults.marker('sample')}")
    assert r.status_code == 500, r.text
    assert r.json()["error"]["code"] == "request_failed"
    time.sleep(0.3)
    attempts = [ev["data"]["attempt"] for ev in c.events.of("route")]
    assert attempts == [1], attempts  # one engine saw it, not both
    failed = {n for n, e in p.engines.items() if "request failed" in e.log()}
    assert len(failed) == 1, failed
    es = c.engines()
    assert all(es[n]["alive"] and es[n]["stage"] == "ready" for n in TWIN)
    assert "retrying elsewhere" not in c.log()
    assert _chat(c, "smollm2-135m").status_code == 200


# ----- 3. phantom in-flight requests, 4. oversized requests ----------------------------------


def test_unsendable_and_oversized_requests_leave_the_pool_intact(pool: Callable[..., Pool]) -> None:
    p = pool(engines=("dev-a",), extra={"max_body_bytes": 20 << 20})
    c = p.c
    c.wait_serving({"dev-a": "smollm2-135m"})
    # 68 requests with a lone surrogate: each refused, none left "in flight" on the engine.
    raw = json.dumps({"model": "smollm2-135m", "max_tokens": 4, "stop": ["\udfff"],
                      "messages": [{"role": "user", "content": "hi"}]})
    for _ in range(68):
        r = c.http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"]
    es = c.engines()
    assert es["dev-a"]["inflight"] == 0 and c.http.get("/health").json()["inflight"] == 0
    for _ in range(3):
        assert _chat(c, "smollm2-135m").status_code == 200
    # 17 MiB: within this coordinator's body limit, beyond what the bus carries to an engine.
    big = {"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * (17 << 20)}]}
    r = c.http.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text[:300]
    # 21 MiB: beyond the body limit, refused before it is read.
    big["messages"][0]["content"] = "x" * (21 << 20)
    r = c.http.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
    time.sleep(3 * INTERVAL)
    assert not c.events.of("engine.down")
    es = c.engines()
    assert es["dev-a"]["alive"] and es["dev-a"]["inflight"] == 0
    assert _chat(c, "smollm2-135m").status_code == 200
    assert "Traceback" not in c.log()


def test_the_default_body_limit_and_a_slow_body(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, extra={"body_timeout_s": 1.0})
    try:
        c.wait_ready()
        r = c.http.post("/v1/completions", content=b"{" + b" " * (9 << 20) + b"}",
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        with socket.create_connection(("127.0.0.1", c.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\":")
            data = b""
            t0 = time.monotonic()
            while b"}" not in data and time.monotonic() - t0 < 8:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert b'"code":"timeout"' in data.replace(b" ", b"")
        assert b"connection: close" in data.lower()  # the rest of the body may still come
    finally:
        c.stop()


# ----- 5. abandoned requests ----------------------------------------------------------------


@pytest.mark.serial  # the slot freed within 2 s
def test_a_client_that_goes_away_frees_its_slot(pool: Callable[..., Pool]) -> None:
    p = pool(engines=("dev-a",))
    c = p.c
    c.wait_serving({"dev-a": "smollm2-135m"})
    body = {"model": "smollm2-135m", "max_tokens": 4000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    # Non-streaming: the client gives up after a second and closes its connection.
    with httpx.Client(base_url=c.url, timeout=1.5) as h:
        with pytest.raises(httpx.ReadTimeout):
            h.post("/v1/chat/completions", json=body)
    gone = time.monotonic()
    while p.busy_slots("dev-a") and time.monotonic() - gone < 10:
        time.sleep(0.05)
    freed = time.monotonic() - gone
    # (once seen failing in CI, never locally: the logs say where the cancel went next time)
    assert p.busy_slots("dev-a") == 0, (c.log()[-4000:], p.engines["dev-a"].log()[-4000:])
    assert freed < 2.0, f"the slot stayed busy {freed:.1f}s after the client left"
    # Streaming: read a few chunks, then hang up.
    with httpx.Client(base_url=c.url, timeout=30) as h:
        with h.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert p.busy_slots("dev-a") == 1
    gone = time.monotonic()
    while p.busy_slots("dev-a") and time.monotonic() - gone < 10:
        time.sleep(0.05)
    assert time.monotonic() - gone < 2.0
    assert c.engines()["dev-a"]["inflight"] == 0


# ----- 6. the profile after an engine failure ---------------------------------------------


def test_a_dead_engines_model_evicts_no_other_and_the_profile_comes_back(pool: Callable[..., Pool]) -> None:
    p = pool()
    c = p.c
    c.wait_serving(DEV)
    os.kill(p.engines["dev-b"].proc.pid, signal.SIGKILL)
    c.wait_engines(lambda es: not es["dev-b"]["alive"], 10, what="dev-b dead")
    r = _chat(c, "gemma3-270m")
    assert r.status_code == 503, r.text  # served nowhere now; dev-a keeps its own model
    assert "dev-a" in r.json()["error"]["message"]
    time.sleep(1.0)
    es = c.engines()
    assert es["dev-a"]["model"] == "smollm2-135m" and es["dev-a"]["stage"] == "ready"
    assert not es["dev-a"]["loading_model"] and not c.events.of("engine.load")
    assert _chat(c, "smollm2-135m").status_code == 200
    # dev-b comes back (a new process, model-less): the coordinator gives it its profile model again.
    b = p.engines["dev-b"]
    b.stop()
    b.notify.path.unlink()
    p.engine("dev-b")
    c.wait_serving(DEV, 90)
    prof = c.http.get("/admin/profile").json()
    assert all(e["matches"] for e in prof["engines"].values()), prof["engines"]
    assert _chat(c, "gemma3-270m").status_code == 200


# ----- 2. authentication ------------------------------------------------------------------


def test_admin_needs_an_allowed_address_and_the_token(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    c = Coordinator(tmp_path / "a", admin_token=True)
    far = Coordinator(tmp_path / "b", extra={"admin_allow_from": ["10.0.0.0/8"]})
    try:
        c.wait_ready()
        far.wait_ready()
        with httpx.Client(base_url=c.url, timeout=10) as anon:
            for method, path in (("GET", "/admin/engines"), ("GET", "/admin/profile"), ("POST", "/admin/profile"),
                                 ("POST", "/admin/route"), ("GET", "/admin/nothing")):
                r = anon.request(method, path, json={"name": "dev"})
                assert r.status_code == 401, (path, r.text)
                assert r.json()["error"]["code"] == "unauthorized" and r.headers["www-authenticate"].startswith("Bearer")
            r = anon.get("/admin/engines", headers={"Authorization": "Bearer " + "y" * 43})
            assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
            assert anon.get("/health").status_code in (200, 503)  # the front door is not /admin
        assert c.http.get("/admin/engines").status_code == 200  # the helper sends the token
        # hydractl: without the token a clear error, with $HYDRA_ADMIN_TOKEN_FILE the answer.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_ADMIN_TOKEN")}
        cmd = [sys.executable, "-m", "hydrad.cli.hydractl", "engines", c.url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO))
        assert r.returncode != 0 and "HYDRA_ADMIN_TOKEN_FILE" in r.stderr, r.stderr
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(REPO),
                           env={**env, "HYDRA_ADMIN_TOKEN_FILE": str(tmp_path / "a" / "admin.token")})
        assert r.returncode == 3 and "0/0 engines alive" in r.stdout, (r.stdout, r.stderr)
        r = far.http.post("/admin/profile", json={"name": "dev"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert "admin_allow_from" in r.json()["error"]["message"]
    finally:
        c.stop()
        far.stop()


def test_the_bus_admits_only_engines_with_the_pool_token(tmp_path: Path, smollm_path: Path,
                                                         start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, heartbeat_interval_s=INTERVAL)
    ctx = zmq.Context()
    try:
        c.wait_ready()
        # A real engine without the token file is refused, says so, and keeps trying.
        stray = start_engine(name="stray", extra={"bus": {"endpoint": c.bus, "heartbeat_interval_s": INTERVAL}})
        # A raw DEALER registering without a token gets a clear refusal and nothing else.
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.IDENTITY, b"rogue~1")
        d.connect(c.bus)
        d.send_multipart(M.encode(M.Register(engine="rogue", instance="x.1", version="0")))
        assert d.poll(5000)
        refused = M.decode(d.recv_multipart())
        assert isinstance(refused, M.Refused) and "token" in refused.reason
        good = start_engine(name="good", extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        c.wait_engines(lambda es: "good" in es and es["good"]["alive"], 30, what="good registered")
        time.sleep(4 * INTERVAL)
        assert set(c.engines()) == {"good"}
        assert "the coordinator refuses this engine" in stray.log() and "needs a token" in stray.log()
        assert not d.poll(200)  # no PING, no request for the rogue
        assert "REGISTER refused" in c.log()
        assert good.proc.poll() is None and stray.proc.poll() is None
    finally:
        ctx.destroy(0)
        c.stop()


# ----- 7. session ids -----------------------------------------------------------------------


def test_bad_session_ids_are_a_400(tmp_path: Path) -> None:
    c = Coordinator(tmp_path)
    try:
        c.wait_ready()
        body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]}
        for sid in ("line\nbreak", "trailing newline\n", "café", "\u4f1a\u8bdd", " padded", "x" * 257, "tab\there"):
            r = c.http.post("/v1/chat/completions", json={**body, "session_id": sid})
            assert r.status_code == 400, (sid, r.text)
            assert r.json()["error"]["param"] == "session_id"
        r = c.http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "caf\u00e9".encode("utf-8")})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
        r = c.http.post("/admin/route", json={**body, "session_id": "a\rb"})
        assert r.status_code == 400
    finally:
        c.stop()

"""The coordinator end to end: real hydrad engines, a real hydra-coordinator process, real ZeroMQ.

Engines boot model-less and get their models from the coordinator's active profile, as
they would under systemd. Faults are real: SIGSTOP (heartbeats stop, TCP stays up) and
SIGKILL (the connection drops) of engine processes, garbage on the bus from raw sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import openai
import pytest
import yaml
import zmq

from hydrad.wire import messages as M
from hydrad.engine.gpu import bound_device
from hydrad.wire.rpcclient import RpcClient
from tests.support.coordinator import Coordinator
from tests.support.engine import GEMMA, REPO, SMOLLM, Engine, metric, models_dir, steps_of_bursts
from tests.support.wait import eventually

pytestmark = pytest.mark.model

INTERVAL = 0.5
DEV_PROFILES = REPO / "etc" / "hydra" / "dev" / "profiles.yaml"
DEV = {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}
SWAPPED = {"dev-a": "gemma3-270m", "dev-b": "smollm2-135m"}
TWIN_PROFILES = {
    "profiles": {"twin": {"description": "both engines serve SmolLM2, one slot each",
                          "engines": {n: {"model": "smollm2-135m", "params": {"n_parallel": 1, "n_ctx": 4096}}
                                      for n in ("dev-a", "dev-b")}}},
    "default": "twin",
}
TWIN = {"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"}


class Cluster:
    def __init__(self, tmp: Path, coordinator: Coordinator, start_engine: Callable[..., Engine]) -> None:
        self.tmp = tmp
        self.c = coordinator
        self._start = start_engine
        self.engines: dict[str, Engine] = {}

    def engine(self, name: str, **defaults: Any) -> Engine:
        # One thread each, as in etc/hydra/dev: two engines spinning two threads each on two cores
        # slowed a 48-token answer from 2 s to 30 s.
        e = self._start(name=name, defaults={"n_ctx": 2048, "n_parallel": 2, "n_threads": 1, **defaults},
                        extra={"bus": self.c.engine_bus(heartbeat_interval_s=INTERVAL)})
        self.engines[name] = e
        return e

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.c.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def cluster(tmp_path: Path, smollm_path: Path, gemma_path: Path,
            start_engine: Callable[..., Engine]) -> Iterator[Callable[..., Cluster]]:
    started: list[Coordinator] = []

    def make(profiles: Any = DEV_PROFILES, default_profile: str | None = None, engines: tuple[str, ...] = ("dev-a", "dev-b"),
             env: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> Cluster:
        c = Coordinator(tmp_path, profiles=profiles, default_profile=default_profile, heartbeat_interval_s=INTERVAL,
                        env=env, extra=extra)
        started.append(c)
        c.wait_ready()
        cl = Cluster(tmp_path, c, start_engine)
        for name in engines:
            cl.engine(name)
        return cl

    yield make
    for c in started:
        c.stop()


def chat(c: Coordinator, model: str | None, text: str, *, max_tokens: int = 8, session: str | None = None,
         messages: list[dict[str, str]] | None = None, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"messages": messages or [{"role": "user", "content": text}], "max_tokens": max_tokens,
                            "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    if session is not None:
        body["session_id"] = session
    return c.http.post("/v1/chat/completions", json=body)


def sse_lines(r: httpx.Response) -> Iterator[str]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            yield line[6:]


# ----- registration and the OpenAI front door ------------------------------------------------


def test_engines_register_and_serve_openai_through_the_coordinator(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(env={"WATCHDOG_USEC": "1000000"})
    c = cl.c
    engines = c.wait_serving(DEV)
    for name, e in engines.items():
        assert e["http"] == f"127.0.0.1:{cl.engines[name].port}"
        assert e["rpc"] and e["rpc"].startswith("127.0.0.1:")
        assert e["gpu"]["arch"] and e["gpu"]["vram_total"] > 0
        assert set(e["models_on_disk"]) >= {"smollm2-135m", "gemma3-270m"}
        assert e["version"] and e["slots_total"] == 2 and e["heartbeat_interval_s"] == INTERVAL
    ups = {ev["data"]["engine"] for ev in c.events.of("engine.up")}
    assert ups == {"dev-a", "dev-b"}

    client = cl.client()
    assert {m.id for m in client.models.list().data} == {"smollm2-135m", "gemma3-270m"}

    raw = client.chat.completions.with_raw_response.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0)
    reply = raw.parse()
    assert raw.headers["x-hydra-engine"] == "dev-a"
    assert reply.model == "smollm2-135m" and reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    stream = client.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": "Count to five."}],
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    route = c.events.wait("route", lambda ev: ev["data"]["req"] == chunks[0].id)
    assert route["data"]["engine"] == "dev-b" and route["data"]["step"] == "cost"
    assert {cand["engine"] for cand in route["data"]["candidates"]} >= {"dev-b"}

    done = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert done.choices[0].text and done.model == "smollm2-135m"

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    health = c.http.get("/health")
    assert health.status_code == 200 and health.json()["models"] == ["gemma3-270m", "smollm2-135m"]
    assert c.http.get("/v1/nothing").json()["error"]["code"] == "not_found"

    c.notify.wait_for("READY=1")
    assert "WATCHDOG=1" in c.notify.lines() or c.notify.wait_for("WATCHDOG=1", 3)
    c.notify.wait_prefix("STATUS=engines 2/2 alive; profile dev; serving gemma3-270m,smollm2-135m")
    assert c.stop() == 0
    assert "STOPPING=1" in c.notify.lines()


def test_session_goes_back_to_its_kv_and_load_spreads(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(profiles=TWIN_PROFILES)
    c = cl.c
    c.wait_serving(TWIN)
    # One slot per engine: a long request keeps one engine busy...
    long: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: long.update(r=c.http.post("/v1/completions", json={
        "model": "smollm2-135m", "prompt": "List the numbers:", "max_tokens": 48, "ignore_eos": True})))
    t.start()
    first_route = c.events.wait("route", lambda ev: ev["data"]["req"].startswith("cmpl-"))
    busy = first_route["data"]["engine"]
    # ...so the first turn of a session goes to the other one (load spreads).
    conv = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a fruit that is yellow."}]
    r1 = chat(c, "smollm2-135m", "", messages=conv, max_tokens=12, session="s-1")
    assert r1.status_code == 200, r1.text
    home = r1.headers["x-hydra-engine"]
    assert home != busy
    t.join(120)
    assert long["r"].status_code == 200 and long["r"].headers["x-hydra-engine"] == busy
    # Both engines idle again: without affinity the tie would go elsewhere at least as often, but
    # the second turn of the session goes to the engine holding its KV and reuses it.
    conv2 = [*conv, {"role": "assistant", "content": r1.json()["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And a red one?"}]
    r2 = chat(c, "smollm2-135m", "", messages=conv2, max_tokens=8, session="s-1")
    assert r2.status_code == 200, r2.text
    assert r2.headers["x-hydra-engine"] == home and r2.headers["x-hydra-route"] == "affinity"
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 10
    # Without a session id the conversation itself leads back to the same KV.
    r3 = c.http.post("/v1/chat/completions", json={"model": "smollm2-135m", "messages": conv2, "max_tokens": 4})
    assert r3.headers["x-hydra-engine"] == home and r3.headers["x-hydra-route"] == "affinity"
    # The header works as well as the body field.
    conv3 = [*conv2, {"role": "assistant", "content": r2.json()["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And a green one?"}]
    r4 = c.http.post("/v1/chat/completions", json={"model": "smollm2-135m", "messages": conv3, "max_tokens": 4},
                     headers={"X-Session-Id": "s-1"})
    assert r4.headers["x-hydra-engine"] == home and r4.headers["x-session-id"] == "s-1"
    sessions = {n: e["sessions"] for n, e in c.engines().items()}
    assert sessions[home] == 1 and sessions[busy] == 0


# ----- engine failures -----------------------------------------------------------------------

LONG_PROMPT = " ".join(f"item {i} is number {i}." for i in range(250))  # ~2,000 tokens: prefill takes a while


def _kill_before_the_first_token(cl: Cluster, ask: Callable[[], None]) -> dict[str, Any]:
    """Run ``ask`` on a thread, and kill the engine its request is first routed to while it prefills;
    the route event of that first attempt (``ask`` has ended when this returns)."""
    seen = {ev["data"]["req"] for ev in cl.c.events.of("route")}
    t = threading.Thread(target=ask)
    t.start()
    chosen = cl.c.events.wait("route", lambda ev: ev["data"]["attempt"] == 1 and ev["data"]["req"] not in seen)["data"]
    victim = cl.engines[chosen["engine"]]
    os.kill(victim.proc.pid, signal.SIGSTOP)  # frozen mid-prefill: it cannot have sent a token
    os.kill(victim.proc.pid, signal.SIGKILL)
    t.join(120)
    return chosen


def test_engine_killed_before_the_first_token_is_retried_elsewhere(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(profiles=TWIN_PROFILES, default_profile="twin")
    c = cl.c
    c.wait_serving(TWIN)
    out: dict[str, Any] = {}

    def ask() -> None:
        t0 = time.monotonic()
        with c.http.stream("POST", "/v1/chat/completions", json={
                "model": "smollm2-135m", "stream": True, "max_tokens": 6, "temperature": 0,
                "messages": [{"role": "user", "content": LONG_PROMPT + " Which item is number 7?"}]}) as r:
            out["status"] = r.status_code
            out["engine"] = r.headers.get("x-hydra-engine")
            out["lines"] = list(sse_lines(r))
        out["seconds"] = time.monotonic() - t0

    chosen = _kill_before_the_first_token(cl, ask)
    assert out["status"] == 200, out
    assert out["engine"] != chosen["engine"]
    assert out["lines"][-1] == "[DONE]"
    assert not any("error" in json.loads(x) for x in out["lines"][:-1])
    retry = c.events.wait("route", lambda ev: ev["data"]["req"] == chosen["req"] and ev["data"]["attempt"] == 2)["data"]
    assert retry["engine"] == out["engine"]
    assert "retrying elsewhere" in c.log()
    c.wait_engines(lambda es: not es[chosen["engine"]]["alive"], 5, what="victim marked dead")


def test_engine_killed_mid_stream_ends_with_an_error_event_then_done(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(profiles=TWIN_PROFILES)
    c = cl.c
    c.wait_serving(TWIN)
    body = {"model": "smollm2-135m", "stream": True, "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}
    # Raw SSE: the exact framing a client sees.
    with c.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        victim = cl.engines[r.headers["x-hydra-engine"]]
        lines = sse_lines(r)
        for _ in range(4):
            assert "error" not in json.loads(next(lines))
        os.kill(victim.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        rest = list(lines)
        waited = time.monotonic() - t0
    assert rest[-1] == "[DONE]"
    err = json.loads(rest[-2])["error"]
    assert err["code"] == "engine_failed" and victim.config.stem in err["message"]
    assert all("error" not in json.loads(x) for x in rest[:-2])
    assert waited < 3 * INTERVAL + 2, f"the stream took {waited:.1f}s to end"
    # The official client turns that event into an APIError instead of hanging.
    other = next(e for e in cl.engines.values() if e is not victim)
    client = cl.client()
    stream = client.chat.completions.create(model=body["model"], messages=body["messages"], max_tokens=400,
                                            stream=True, extra_body={"ignore_eos": True})
    got = 0
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got += 1
                if got == 3:
                    os.kill(other.proc.pid, signal.SIGKILL)
    # Nothing left to serve: a clear 503 naming why, not a hang or a bare 500.
    c.wait_engines(lambda es: not any(e["alive"] for e in es.values()), 5, what="both engines dead")
    r = chat(c, "smollm2-135m", "hi")
    assert r.status_code == 503 and "not alive" in r.json()["error"]["message"]


@pytest.mark.serial  # detection timed to three heartbeat intervals
def test_dead_engine_is_detected_within_three_intervals_and_readmitted(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(profiles=TWIN_PROFILES)
    c = cl.c
    c.wait_serving(TWIN)
    b = cl.engines["dev-b"]
    # Frozen: TCP stays up, heartbeats stop.
    os.kill(b.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    c.wait_engines(lambda es: not es["dev-b"]["alive"], 10, what="dev-b dead")
    took = time.monotonic() - t0
    assert took <= 3 * INTERVAL + 1.0, f"marked dead after {took:.2f}s"
    down = c.events.wait("engine.down", lambda ev: ev["data"]["engine"] == "dev-b")
    assert "no heartbeat" in down["data"]["reason"]
    for _ in range(3):  # the pool keeps serving on what is left
        r = chat(c, "smollm2-135m", "hi")
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == "dev-a"
    # Thawed: it hears that it was dropped and registers again.
    os.kill(b.proc.pid, signal.SIGCONT)
    c.wait_engines(lambda es: es["dev-b"]["alive"], 15, what="dev-b re-admitted")
    # Killed: the connection drops, noticed at the next PING.
    first = c.engines()["dev-b"]
    os.kill(b.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    c.wait_engines(lambda es: not es["dev-b"]["alive"], 10, what="dev-b dead after SIGKILL")
    assert time.monotonic() - t0 <= 3 * INTERVAL + 1.0
    # Restarted under the same name (new process, new ports): re-admitted and given its profile model.
    b.stop()
    b.notify.path.unlink()  # the restarted engine binds its own notify socket at the same path
    b2 = cl.engine("dev-b")
    es = c.wait_serving(TWIN)
    assert es["dev-b"]["instance"].split(".")[0] != first["instance"].split(".")[0]
    assert es["dev-b"]["http"] == f"127.0.0.1:{b2.port}" != first["http"]
    ups = [ev for ev in c.events.of("engine.up") if ev["data"]["engine"] == "dev-b"]
    assert len(ups) >= 3  # boot, thaw, restart
    os.kill(cl.engines["dev-a"].proc.pid, signal.SIGSTOP)
    try:
        r = chat(c, "smollm2-135m", "hi")  # if routing picks frozen dev-a, it is found dead and dev-b serves
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == "dev-b"
        c.wait_engines(lambda es: not es["dev-a"]["alive"], 10, what="dev-a dead")
        r = chat(c, "smollm2-135m", "hi")
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == "dev-b"
    finally:
        os.kill(cl.engines["dev-a"].proc.pid, signal.SIGCONT)


# ----- profiles ------------------------------------------------------------------------------


def test_profile_switch_keeps_serving_and_publishes_progress(cluster: Callable[..., Cluster]) -> None:
    cl = cluster()
    c = cl.c
    c.wait_serving(DEV)
    assert c.http.get("/admin/profile").json()["active"] == "dev"
    # GET /admin/profile: every profile's entries and the plan a switch to it would carry out now
    # the engines' LOADED may trail their ready heartbeat a little
    plans = eventually(lambda: c.http.get("/admin/profile").json()["plans"], 10, "an empty reload plan for dev",
                       until=lambda plans: not plans["dev"]["reload"], interval=0.05)
    assert plans["dev"]["reload"] == {} and plans["dev"]["unchanged"] == ["dev-a", "dev-b"]
    assert plans["swapped"]["engines"] == {"dev-a": {"model": "gemma3-270m", "mode": "SOLO", "peer": None},
                                           "dev-b": {"model": "smollm2-135m", "mode": "SOLO", "peer": None}}
    assert {e: (p["from"], p["to"], p["model_changes"]) for e, p in plans["swapped"]["reload"].items()} == {
        "dev-a": ("smollm2-135m", "gemma3-270m", True), "dev-b": ("gemma3-270m", "smollm2-135m", True)}
    assert plans["swapped"]["unchanged"] == [] and plans["swapped"]["absent"] == [] and not plans["swapped"]["errors"]
    stop = threading.Event()
    results: list[tuple[float, float, int, str, str]] = []  # start, end, status, model, engine (or error body)

    def traffic() -> None:
        with httpx.Client(base_url=c.url, timeout=120) as h:
            i = 0
            while not stop.is_set():
                model = ("smollm2-135m", "gemma3-270m")[i % 2]
                t0 = time.monotonic()
                r = h.post("/v1/chat/completions", json={"model": model, "max_tokens": 4,
                                                          "messages": [{"role": "user", "content": f"Say {i}."}]})
                results.append((t0, time.monotonic(), r.status_code, model, r.headers.get("x-hydra-engine", r.text)))
                i += 1

    t = threading.Thread(target=traffic)
    t.start()
    eventually(lambda: len(results), 60, "traffic before the switch", interval=0.05)
    t_switch = time.monotonic()
    r = c.http.post("/admin/profile", json={"name": "swapped"})
    t_done = time.monotonic()
    n = len(results)
    eventually(lambda: len(results), 120, "two more responses after the switch", until=lambda k: k >= n + 2,
               interval=0.05)
    stop.set()
    t.join(60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["ok"] and out["profile"] == "swapped" and out["previous"] == "dev"
    assert set(out["engines"]) == {"dev-a", "dev-b"} and all(e["ok"] for e in out["engines"].values())
    assert set(out["engines"]) == set(plans["swapped"]["reload"])  # the switch did what the plan said
    assert 0 < out["seconds"] <= t_done - t_switch + 0.1
    c.wait_serving(SWAPPED, 10)
    prof = c.http.get("/admin/profile").json()
    assert prof["active"] == "swapped" and prof["state"] == "steady"
    assert all(e["matches"] for e in prof["engines"].values())
    # Progress on PUB.
    assert c.events.wait("profile.start", lambda ev: ev["data"]["profile"] == "swapped")["data"]["engines"] == ["dev-a", "dev-b"]
    assert c.events.of("profile.progress"), "no progress events"
    assert {ev["data"]["engine"] for ev in c.events.of("profile.engine") if ev["data"].get("phase") == "done"
            and ev["data"].get("why") == "profile swapped"} == {"dev-a", "dev-b"}
    done = c.events.wait("profile.done", lambda ev: ev["data"]["profile"] == "swapped")["data"]
    assert done["ok"] and done["seconds"] == out["seconds"]
    # Requests kept being served through the switch, by whichever engine served their model.
    during = [x for x in results if x[0] < t_done and x[1] > t_switch]
    assert during, "no request was in flight during the switch"
    assert all(code == 200 for _, _, code, _, _ in results), [x for x in results if x[2] != 200]
    served_by = {(m, e) for _, _, _, m, e in results}
    assert ("smollm2-135m", "dev-a") in served_by and ("smollm2-135m", "dev-b") in served_by
    # Unknown profile, a switch while one runs, a bad body.
    assert c.http.post("/admin/profile", json={"name": "nope"}).status_code == 404
    assert c.http.post("/admin/profile", json={"nom": "dev"}).status_code == 400
    assert c.http.post("/admin/profile", json={"name": "dev", "wait": False}).status_code == 202
    assert c.http.post("/admin/profile", json={"name": "dev"}).status_code == 409
    eventually(lambda: c.http.get("/admin/profile").json()["state"], 60, "the profile state to be steady",
               until=lambda state: state == "steady", interval=0.1)
    c.wait_serving(DEV, 10)


# ----- robustness of the bus ----------------------------------------------------------------


def test_malformed_messages_and_unknown_engines_are_dropped(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(engines=("dev-a",))
    c = cl.c
    c.wait_serving({"dev-a": "smollm2-135m"})
    ctx = zmq.Context()
    socks = []
    try:
        def dealer(identity: bytes) -> zmq.Socket:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IDENTITY, identity)
            s.connect(c.bus)
            socks.append(s)
            return s

        intruder = dealer(b"intruder")
        time.sleep(0.2)
        for frames in ([b"junk"], [b""], [M.PROTOCOL], [b"hydra-bus/0", b"PING", b"{}"], [M.PROTOCOL, b"NOPE", b"{}"],
                       [M.PROTOCOL, b"HEARTBEAT", b"{broken"], [M.PROTOCOL, b"HEARTBEAT", b"[" * 50_000],
                       [M.PROTOCOL, b"TOKENS", json.dumps({"req": "x", "texts": []}).encode()],
                       M.encode(M.Generate(req="g-1", prompt="wrong direction")),
                       M.encode(M.Tokens(req="gen-nope-1", texts=["stray"])),
                       [M.PROTOCOL, b"DONE", os.urandom(300)],
                       [M.PROTOCOL, b"REGISTER", b"{broken"]):  # only a REGISTER of a stranger is decoded at all
            intruder.send_multipart(frames)
        # A well-formed heartbeat from a name that never registered: dropped, and told to register.
        intruder.send_multipart(M.encode(M.Heartbeat(status=M.EngineStatus(stage="ready", model="smollm2-135m"))))
        assert intruder.poll(3000), "no answer to an unregistered heartbeat"
        assert isinstance(M.decode(intruder.recv_multipart()), M.Reregister)
        # A REGISTER claiming another engine's name than its identity.
        dealer(b"mallory").send_multipart(M.encode(M.Register(engine="dev-a", instance="x.1", version="0")))
        dealer(b"\xff\x00bad").send_multipart(M.encode(M.Ping()))
        time.sleep(3 * INTERVAL)
        assert c.proc.poll() is None
        engines = c.engines()
        assert set(engines) == {"dev-a"} and engines["dev-a"]["alive"]
        assert engines["dev-a"]["instance"] != "x.1"
        r = chat(c, "smollm2-135m", "hi")
        assert r.status_code == 200
        log = c.log()
        # messages of any other kind from a peer that is not an admitted engine are dropped before their
        # body is decoded (so malformed and wrong-direction ones from a stranger read as "unregistered")
        for text in ("malformed bus message dropped", "unregistered engine", "invalid identity",
                     "REGISTER naming another engine"):
            assert text in log, text
        assert "Traceback" not in log and "level=error" not in log
    finally:
        ctx.destroy(0)


def test_curve_keys_encrypt_the_bus(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """With bus CURVE keys an engine that knows the coordinator's public key registers; a plaintext
    peer, or one expecting another server key, never gets a message through."""
    public, secret = (k.decode() for k in zmq.curve_keypair())
    c = Coordinator(tmp_path, curve=(public, secret), heartbeat_interval_s=INTERVAL)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    try:
        c.wait_ready()
        e = start_engine(name="sealed", extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL,
                                                                   curve_server_key=public)})
        c.wait_engines(lambda es: "sealed" in es and es["sealed"]["alive"], 30, what="sealed engine registered")
        plain = ctx.socket(zmq.DEALER)
        wrong = ctx.socket(zmq.DEALER)
        other_public, _ = zmq.curve_keypair()
        wrong.curve_serverkey = other_public
        wrong.curve_publickey, wrong.curve_secretkey = zmq.curve_keypair()
        for name, sock in ((b"plain", plain), (b"wrong", wrong)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, name)
            sock.connect(c.bus)
            sock.send_multipart(M.encode(M.Register(engine=name.decode(), instance="x.1", version="0")))
        time.sleep(3 * INTERVAL)
        engines = c.engines()
        assert set(engines) == {"sealed"} and engines["sealed"]["alive"]
        assert "registered with the coordinator" in e.log() and "curve=true" in e.log()
        # the events are encrypted too, and read with the key pair the events token gives
        assert c.events.wait("engine.up")["data"]["engine"] == "sealed"
    finally:
        ctx.destroy(0)
        c.stop()


def test_engine_link_against_a_raw_router(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The engine's side alone: REGISTER until WELCOME, garbage ignored, GENERATE streamed, and a
    silent coordinator makes it reconnect and register again."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    answering = [True]
    ident = [b""]  # the engine's DEALER identity: "solo~<nonce>", new for every connection
    try:
        e = start_engine(name="solo", defaults={"model": "smollm2-135m", "n_ctx": 1024, "n_parallel": 1},
                         extra={"bus": {"endpoint": f"tcp://127.0.0.1:{port}", "heartbeat_interval_s": INTERVAL}})

        held: list[Any] = []  # the rest of a batch (a step's stream messages travel together)

        def recv(kind: Any, timeout: float = 20.0, pred: Callable[[Any], bool] = lambda _: True) -> Any:
            """Next message of ``kind``; every message is answered with a PING, as a coordinator would."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not held and router.poll(100):
                    ident[0], *frames = router.recv_multipart()
                    assert ident[0].split(b"~")[0] == b"solo" and len(ident[0]) > len(b"solo~")
                    held.extend(M.decode_all(frames))
                    if answering[0]:
                        router.send_multipart([ident[0], *M.encode(M.Ping())])
                while held:
                    msg = held.pop(0)
                    if isinstance(msg, kind) and pred(msg):
                        return msg
            raise AssertionError(f"no {kind} from the engine within {timeout}s\n{e.log()}")

        reg = recv(M.Register)
        assert reg.engine == "solo" and reg.http == f"127.0.0.1:{e.port}" and "smollm2-135m" in reg.models_on_disk
        assert reg.heartbeat_interval_s == INTERVAL and reg.gpu.vram_total > 0
        for frames in ([b"junk"], [M.PROTOCOL, b"NOPE", b"{}"], [M.PROTOCOL, b"GENERATE", b"{"],
                       M.encode(M.Heartbeat(status=M.EngineStatus()))):
            router.send_multipart([ident[0], *frames])
        assert isinstance(recv(M.Register), M.Register)  # not welcomed yet: it keeps registering
        router.send_multipart([ident[0], *M.encode(M.Welcome(coordinator="test", version="0"))])
        beat = recv(M.Heartbeat, pred=lambda m: m.status.stage == "ready")
        assert beat.status.model == "smollm2-135m" and beat.status.slots_total == 1
        router.send_multipart([ident[0], *M.encode(M.Generate(req="g-1", prompt="Once upon a time", max_tokens=8,
                                                              model="smollm2-135m", ignore_eos=True))])
        texts: list[str] = []
        while True:
            msg = recv((M.Tokens, M.Done, M.Error))
            if isinstance(msg, M.Tokens):
                assert msg.req == "g-1"
                texts.extend(msg.texts)
            else:
                break
        assert isinstance(msg, M.Done) and msg.usage.completion_tokens == 8 and "".join(texts)
        assert msg.model == "smollm2-135m" and msg.fingerprint
        router.send_multipart([ident[0], *M.encode(M.Generate(req="g-2", prompt="x", model="gemma3-270m"))])
        err = recv(M.Error)
        assert err.req == "g-2" and err.code == "model_not_loaded" and err.status == 503
        router.send_multipart([ident[0], *M.encode(M.Configure(req="c-1", payload={"n_ctx": "lots"}))])
        bad = recv(M.ConfigureReply)
        assert not bad.ok and bad.status == 400
        # A message over the bus limit is dropped by the engine like any malformed one; the link
        # stays up (a ZeroMQ size limit would drop the connection and every request on it).
        before = ident[0]
        router.send_multipart([ident[0], M.PROTOCOL, b"GENERATE",
                               b'{"req":"g-big","prompt":"' + b"x" * (M.MAX_BODY + 1) + b'"}'])
        router.send_multipart([ident[0], *M.encode(M.Generate(req="g-3", prompt="Hello", max_tokens=2,
                                                              model="smollm2-135m"))])
        assert isinstance(recv(M.Done, pred=lambda m: m.req == "g-3"), M.Done)
        assert ident[0] == before
        eventually(lambda: "oversized bus message dropped" in e.log(), 5, "the oversized message's log line",
                   interval=0.05, context=lambda: e.log()[-3000:])
        assert e.proc.poll() is None and "malformed bus message dropped" in e.log()
        # From now on the "coordinator" says nothing: after 3 intervals the engine reconnects.
        answering[0] = False
        t0 = time.monotonic()
        again = recv(M.Register, timeout=15)
        assert again.instance.split(".")[0] == reg.instance.split(".")[0] and again.instance != reg.instance
        assert time.monotonic() - t0 >= 2 * INTERVAL
        assert "coordinator silent; reconnecting" in e.log()
    finally:
        ctx.destroy(0)


# ----- an engine that loads its own YAML model at boot (as under systemd) --------------------


def _hydractl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("params", [{}, {"n_ctx": 1024}], ids=["same-target", "profile-params-differ"])
def test_engine_booting_the_profile_model_ends_ready_and_serves(
        tmp_path: Path, gemma_path: Path, start_engine: Callable[..., Engine], params: dict[str, Any]) -> None:
    """The engine's YAML ``defaults.model`` is the model the active profile gives it: the
    coordinator's configure on REGISTER joins (or supersedes, with other params) the boot load,
    and the engine must end ``ready`` with the model, the profile matching. A request sent while
    the boot load runs is answered once the load ends, not with a 503."""
    profiles = {"profiles": {"steady": {"engines": {"boot": {"model": "gemma3-270m", "params": params}}}},
                "default": "steady"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        # n_gpu_layers: 0 as on a CPU host; the profile must not override the engine's offload
        e = start_engine(name="boot", defaults={"model": "gemma3-270m", "n_ctx": 2048, "n_parallel": 2, "n_threads": 1,
                                                "n_gpu_layers": 0},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        es = c.wait_engines(lambda es: "boot" in es and es["boot"]["alive"], 60, what="boot registered")
        stage_at_request = es["boot"]["stage"]  # loading_model here: the boot load takes a second or two
        r = chat(c, "gemma3-270m", "Say hi.")
        assert r.status_code == 200, (stage_at_request, r.text, c.log()[-3000:])
        assert r.headers["x-hydra-engine"] == "boot"
        es = c.wait_serving({"boot": "gemma3-270m"}, 60)
        if params:
            assert es["boot"]["n_ctx"] == 1024, es["boot"]
        prof = eventually(lambda: c.http.get("/admin/profile").json(), 10, "the boot engine to match its profile",
                          until=lambda prof: prof["engines"]["boot"]["matches"], interval=0.1)
        assert prof["engines"]["boot"]["matches"] and prof["state"] == "steady", prof
        out = _hydractl("profile", c.url)
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["boot"])
        assert row.split()[-1] == "yes", out.stdout
        # Every later request is served too (the failure mode was: 503 model_not_loaded for good).
        for i in range(2):
            assert chat(c, "gemma3-270m", f"Say {i}.").status_code == 200
        assert "model_not_loaded" not in c.log()
        if not params:  # the same target: the boot load is the only load (no abort, no second load)
            assert "supersedes" not in e.log() and "model load aborted" not in e.log(), e.log()[-3000:]
            assert e.http.get("/control/loads/2").status_code == 404
    finally:
        c.stop()


def test_on_demand_load_after_a_failed_boot_load(
        tmp_path: Path, smollm_path: Path, gemma_path: Path, start_engine: Callable[..., Engine]) -> None:
    """An engine whose boot load of its YAML model failed still names that model in its settings.
    An on-demand configure for it used to be a no-op on the engine ("nothing to change"), which the
    coordinator logged as ok before sending GENERATE into a 503 ``model_not_loaded``, on every
    request. While the file stays broken the client gets a 503 naming the failed load; once it is
    fixed, the next request's configure loads it and the request is served."""
    models = tmp_path / "models"
    models.mkdir()
    (models / SMOLLM).symlink_to(models_dir() / SMOLLM)
    (models / GEMMA).write_bytes(b"GGUF" + b"\0" * 4092)  # broken: the boot load fails
    profiles = {"profiles": {"elsewhere": {"engines": {"other": {"model": "smollm2-135m"}}}}, "default": "elsewhere"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        start_engine(name="free", defaults={"model": "gemma3-270m", "n_ctx": 2048, "n_parallel": 2, "n_threads": 1},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL), "models_dir": str(models)})
        c.wait_engines(lambda es: "free" in es and es["free"]["alive"] and es["free"]["stage"] == "idle"
                       and es["free"]["last_error"], 60, what="boot load failed")
        r = chat(c, "gemma3-270m", "Say hi.")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert "gemma3-270m" in err["message"] and "model_not_loaded" not in err["message"], err
        last = c.engines()["free"]["last_configure"]
        assert last["ok"] is False and last["why"] == "on-demand", last
        (models / GEMMA).unlink()
        (models / GEMMA).symlink_to(models_dir() / GEMMA)  # fixed: the next on-demand configure loads it
        r = chat(c, "gemma3-270m", "Say hi.")
        assert r.status_code == 200, r.text
        assert r.headers["X-Hydra-Engine"] == "free"
        assert c.engines()["free"]["last_configure"]["ok"] is True
    finally:
        c.stop()


def test_device_binding_is_reported_on_the_bus_in_hydractl_and_in_info(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """A start-only ``device`` travels in REGISTER to ``/admin/engines``, the ``engine.up`` event
    and ``hydractl engines``, and the merged port's INFO says it too; an unbound engine shows
    none ("all")."""
    if any(os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES")):
        pytest.skip("this environment binds GPUs itself, which wins over the device setting")
    assert bound_device("1") == "1"
    profiles = {"profiles": {"elsewhere": {"engines": {"other": {"model": "smollm2-135m"}}}}, "default": "elsewhere"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        bound = start_engine(name="bound", defaults={"n_ctx": 1024, "n_parallel": 1, "n_threads": 1},
                             extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL), "device": "1"})
        start_engine(name="free", defaults={"n_ctx": 1024, "n_parallel": 1, "n_threads": 1},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        es = c.wait_engines(lambda es: {"bound", "free"} <= set(es) and all(e["alive"] for e in es.values()), 60,
                            what="both registered")
        assert es["bound"]["device"] == "1" and es["free"]["device"] is None
        ups = {ev["data"]["engine"]: ev["data"]["device"] for ev in c.events.of("engine.up")}
        assert ups == {"bound": "1", "free": None}
        out = _hydractl("engines", c.url)
        assert out.returncode == 0, out.stderr
        header, *rows = [line.split() for line in out.stdout.splitlines()[1:3 + 1]]
        col = header.index("device")
        assert {r[0]: r[col] for r in rows} == {"bound": "1", "free": "all"}, out.stdout
        with RpcClient(f"127.0.0.1:{yaml.safe_load(bound.config.read_text())['rpc']['port']}") as rpc:
            assert rpc.info()["device"] == "1"
    finally:
        c.stop()


def test_cache_prompt_reaches_the_engine_through_the_front_door(tmp_path: Path, smollm_path: Path,
                                                                start_engine: Callable[..., Engine]) -> None:
    """A client's ``cache_prompt`` is the engine's to honour whichever door it came in by: GENERATE
    once dropped it, so through the coordinator a ``cache_prompt: false`` request reused a slot's
    KV as the engine's default said."""
    c = Coordinator(tmp_path, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        e = start_engine(name="dev-a", defaults={"model": "smollm2-135m", "n_ctx": 2048, "n_parallel": 1,
                                                 "n_threads": 1, "cache_prompt": True},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        e.wait_ready()
        c.wait_serving({"dev-a": "smollm2-135m"})

        def prompt_tokens() -> tuple[float, float]:
            return metric(e, "llamacpp:prompt_tokens_total"), metric(e, "hydra_cached_prompt_tokens_total")

        body = {"prompt": "The quick brown fox jumps over the lazy dog, and then it", "max_tokens": 1,
                "temperature": 0}
        for cache, evaluated_again in ((False, True), (False, True), (True, False)):
            before = prompt_tokens()
            r = c.http.post("/v1/completions", json={**body, "cache_prompt": cache})
            assert r.status_code == 200, r.text
            evaluated, cached = (a - b for a, b in zip(prompt_tokens(), before))
            n_prompt = r.json()["usage"]["prompt_tokens"]
            if evaluated_again:
                assert (evaluated, cached) == (n_prompt, 0), (cache, evaluated, cached)
            else:
                assert evaluated < n_prompt and cached > 0, (cache, evaluated, cached)
    finally:
        c.stop()


def test_a_burst_through_the_front_door_reaches_the_engine_in_one_step(tmp_path: Path, smollm_path: Path,
                                                                        start_engine: Callable[..., Engine]) -> None:
    """Requests that reach the front door together are sent to their engine back to back, so the engine
    prefills them in one step as it does when they come straight to its port. Before the front door's
    burst gate it parsed, routed and sent them one by one, a few hundred microseconds apart; the engine
    started a step with the first alone and the rest waited that whole step (hydrad/coordinator/burst.py).
    Each request is written to its own connection but its last byte, then the four last bytes back to
    back, as a burst arrives; the engine's ``llama_decode`` count says how many steps they took."""
    c = Coordinator(tmp_path, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        e = start_engine(name="dev-a", defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 4,
                                                 "n_threads": 1, "prefill_split": "batch"},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        e.wait_ready()
        c.wait_serving({"dev-a": "smollm2-135m"})
        bodies = [json.dumps({"prompt": f"Burst {i}: the river carries light stone", "max_tokens": 1,
                              "temperature": 0, "cache_prompt": False}).encode() for i in range(4)]
        steps = steps_of_bursts(e, c.url, "/v1/completions", bodies)
        assert min(steps) == 1, steps
    finally:
        c.stop()


# ----- llama-server's /completion on the one path -----------------------------------------------

def test_native_completion_keeps_its_session_and_is_retried_before_its_first_token(
        cluster: Callable[..., Cluster]) -> None:
    """/completion goes the way chat goes: a session's second turn returns to the engine holding its
    KV, and an engine lost before the first token is replaced by the other one, unseen by the client."""
    cl = cluster(profiles=TWIN_PROFILES, default_profile="twin")
    c = cl.c
    c.wait_serving(TWIN)
    prompt = "Alice keeps a list of fruit: apples, pears, plums, figs, dates. The third fruit is"
    first = c.http.post("/completion", json={"prompt": prompt, "n_predict": 6, "temperature": 0},
                        headers={"X-Session-Id": "native-1"})
    assert first.status_code == 200, first.text
    home = first.headers["x-hydra-engine"]
    assert first.json()["stop"] is True and first.headers["x-session-id"] == "native-1"
    again = c.http.post("/completion", json={"prompt": prompt + first.json()["content"] + " and the fourth is",
                                             "n_predict": 4, "temperature": 0}, headers={"X-Session-Id": "native-1"})
    assert again.status_code == 200, again.text
    assert again.headers["x-hydra-engine"] == home and again.headers["x-hydra-route"] == "affinity"
    assert again.json()["tokens_cached"] > 10  # the first turn's KV, reused on its engine
    assert again.json()["generation_settings"]["n_ctx"] > 0  # the engine's values, carried by the bus

    out: dict[str, Any] = {}

    def ask() -> None:
        with c.http.stream("POST", "/completion", json={
                "prompt": LONG_PROMPT + " Which item is number 7?", "stream": True, "n_predict": 6,
                "temperature": 0, "return_tokens": True}) as r:
            out["status"] = r.status_code
            out["engine"] = r.headers.get("x-hydra-engine")
            out["events"] = [json.loads(x) for x in sse_lines(r)]

    chosen = _kill_before_the_first_token(cl, ask)
    assert out["status"] == 200, out
    assert out["engine"] != chosen["engine"]
    evs = out["events"]
    assert evs[-1]["stop"] is True and not any("error" in ev for ev in evs), evs
    assert sum(len(ev["tokens"]) for ev in evs) == evs[-1]["tokens_predicted"]  # ids over the bus, streamed
    retry = c.events.wait("route", lambda ev: ev["data"]["req"] == chosen["req"] and ev["data"]["attempt"] == 2)["data"]
    assert retry["engine"] == out["engine"]

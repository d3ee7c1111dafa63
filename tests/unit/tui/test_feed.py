"""The console's clients: the admin client's errors (over a mock transport) and the SUB reader
(against a PUB socket of the test's own on loopback, no coordinator)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import httpx
import pytest
import zmq


from hydrad.wire.busevents import Event
from tests.support.engine import free_port
from tui.feed import CONNECTED, DISCONNECTED, AdminClient, AdminError, EventReader, FeedEvent


def admin(handler: Callable[[httpx.Request], httpx.Response]) -> AdminClient:
    return AdminClient("http://coordinator:9000", transport=httpx.MockTransport(handler))


def test_admin_calls() -> None:
    seen: list[tuple[str, str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, req.url.path, json.loads(req.content) if req.content else None))
        if req.method == "POST":
            return httpx.Response(202, json={"profile": "gemma", "state": "switching"})
        return httpx.Response(200, json={"engines": [], "profile": "dense"})

    a = admin(handler)
    assert a.engines() == {"engines": [], "profile": "dense"}
    assert a.switch("gemma")["state"] == "switching"
    assert seen[-1] == ("POST", "/admin/profile", {"name": "gemma", "wait": False})


@pytest.mark.parametrize("response, expect", [
    (httpx.Response(409, json={"error": {"message": "a switch to 'dense' is under way", "code": "busy"}}),
     "HTTP 409: a switch to 'dense' is under way"),
    (httpx.Response(404, json={"error": {"message": "unknown profile 'x'"}}), "HTTP 404: unknown profile 'x'"),
    (httpx.Response(500, text="oops"), "HTTP 500: oops"),
    (httpx.Response(200, text="not json"), "not a JSON object"),
    (httpx.Response(200, json=[1, 2]), "not a JSON object"),
])
def test_admin_errors(response: httpx.Response, expect: str) -> None:
    with pytest.raises(AdminError, match=expect.replace("(", r"\(").replace(")", r"\)")):
        admin(lambda _: response).switch("x")


def test_admin_unreachable() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(AdminError, match="http://coordinator:9000: connection refused"):
        admin(refuse).engines()
    with pytest.raises(AdminError, match="no answer in time"):
        admin(slow).profile()


class Reader:
    """An EventReader on its own thread, collecting what it hands on."""

    def __init__(self, endpoint: str) -> None:
        self.events: list[FeedEvent] = []
        self.batches = 0
        self.states: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self.reader = EventReader(endpoint, reconnect_max_s=0.2)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.reader.run(self._on_events, lambda s, d: self.states.append((s, d)), self._stop.is_set)

    def _on_events(self, batch: list[FeedEvent]) -> None:
        self.batches += 1
        self.events.extend(batch)

    def wait(self, cond: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"not reached; states {self.states}, events {self.events}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(3)
        assert not self.thread.is_alive()


def test_reader_connects_late_reads_batches_and_drops_garbage() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    r = Reader(endpoint)  # nothing listens yet: it says so and keeps retrying
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        r.wait(lambda: any(s == DISCONNECTED for s, _ in r.states))
        pub.bind(endpoint)
        r.wait(lambda: r.states[-1][0] == CONNECTED)
        # a PUB drops what it sends before the subscription arrives: publish until one lands
        deadline = time.monotonic() + 5
        while not r.events and time.monotonic() < deadline:
            pub.send_multipart(Event(topic="engine.up", ts=1.0, data={"engine": "warmup"}).frames())
            time.sleep(0.05)
        batches = r.batches
        pub.send_multipart([b"garbage"])
        pub.send_multipart([b"route", b"{not json"])
        for i in range(50):
            pub.send_multipart(Event(topic="route", ts=2.0, data={"req": f"r{i}", "engine": "a"}).frames())

        def routes() -> list[str]:  # (warm-up events may still trickle in)
            return [e.data["req"] for e in list(r.events) if e.topic == "route"]

        r.wait(lambda: len(routes()) == 50)
        assert routes() == [f"r{i}" for i in range(50)]
        assert r.batches - batches < 50  # a burst comes in batches, not one UI message per event
        assert r.reader.dropped == 2
        pub.close(0)  # the coordinator goes away
        r.wait(lambda: r.states[-1][0] == DISCONNECTED)
    finally:
        pub.close(0)
        ctx.term()
        r.stop()


def test_engine_base_url() -> None:
    from tui.feed import engine_base_url

    admin_url = "http://gpu-host:9000"
    assert engine_base_url("10.0.0.11:8080", admin_url) == "http://10.0.0.11:8080"
    assert engine_base_url("0.0.0.0:8080", admin_url) == "http://gpu-host:8080"  # bound to every address
    assert engine_base_url("[::]:8080", admin_url) == "http://gpu-host:8080"
    assert engine_base_url("[fe80::1]:8080", admin_url) == "http://[fe80::1]:8080"
    assert engine_base_url("http://a:1/", admin_url) == "http://a:1"
    assert engine_base_url(None, admin_url) is None and engine_base_url("nonsense", admin_url) is None


def test_engine_client_config_slots_and_refusal() -> None:
    from tui.feed import EngineClient

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "refusing":
            return httpx.Response(403, json={"error": {"message": "/control is not allowed from 10.0.0.5 "
                                                                  "(control_allow_from)", "code": "forbidden"}})
        if req.url.path == "/control/config":
            return httpx.Response(200, json={"engine": "a", "model": "m",
                                             "params": {"n_ctx": {"value": 4096, "source": "yaml", "tier": "T2"}}})
        if req.url.path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "is_processing": True, "n_tokens": 12, "n_decoded": 3}])
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    c = EngineClient(transport=httpx.MockTransport(handler))
    assert c.config("http://a:8080")["params"]["n_ctx"]["source"] == "yaml"
    assert c.slots("http://a:8080")[0]["n_decoded"] == 3
    with pytest.raises(AdminError, match="refuses /control/config from this host.*control_allow_from") as exc:
        c.config("http://refusing:8080")
    assert exc.value.status == 403
    with pytest.raises(AdminError, match="cannot reach the engine at http://a:8080: connection refused"):
        c._get("http://a:8080", "/elsewhere")

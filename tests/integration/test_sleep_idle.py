"""The idle sleep (``sleep_idle_seconds``, llama-server's ``--sleep-idle-seconds``) on a real engine:
after the idle limit the model leaves the process (its GGUF is no longer mapped) and the stage is
``sleeping``; the first request afterwards loads it again and is answered as before the sleep, at
the engine's own door and through the coordinator's front door (which routes to the sleeping engine
as to one that can load its model)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine, metric
from tests.support.wait import eventually

pytestmark = pytest.mark.model

IDLE_S = 1.5
DEFAULTS = {"model": "smollm2-135m", "n_ctx": 1024, "n_parallel": 2, "n_threads": 1, "temperature": 0,
            "sleep_idle_seconds": IDLE_S}
ASK = {"prompt": "The capital of France is", "max_tokens": 8}


def _mapped(pid: int, model: Path) -> bool:
    """Whether the process maps the model file (use_mmap: llama.cpp reads the weights through it)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return str(model.resolve()) in maps or model.name in maps


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _asleep(e: Engine) -> dict[str, Any]:
    def health() -> tuple[int, dict[str, Any]]:
        e.assert_running()
        r = e.http.get("/health")
        return r.status_code, r.json()

    code, body = eventually(health, IDLE_S + 20, "the engine to sleep", until=lambda h: h[1].get("stage") == "sleeping",
                            interval=0.05, context=e.log)
    assert code == 200 and body["status"] == "sleeping" and body["model"] == "smollm2-135m", body
    return body


def test_engine_sleeps_frees_the_model_and_wakes_for_a_request(start_engine: Callable[..., Engine],
                                                              smollm_path: Path) -> None:
    e = start_engine(defaults=DEFAULTS)
    e.wait_ready()
    want = e.http.post("/v1/completions", json=ASK).json()["choices"][0]["text"]
    assert _mapped(e.proc.pid, smollm_path)
    rss_awake = _rss_kib(e.proc.pid)
    # work keeps it awake: requests spaced below the limit for longer than the limit
    for _ in range(4):
        assert e.http.post("/v1/completions", json=ASK).status_code == 200
        assert e.http.get("/health").json()["stage"] == "ready"
        time.sleep(IDLE_S / 2)  # idle for half the limit, four times over: twice the limit in all
    _asleep(e)
    assert not _mapped(e.proc.pid, smollm_path), "the model file is still mapped while the engine sleeps"
    assert _rss_kib(e.proc.pid) < rss_awake, "the process holds as much memory asleep as awake"
    assert metric(e, "hydra_sleeps_total") == 1
    assert "sleeping" in e.notify.wait_prefix("STATUS=sleeping", timeout=5)
    listed = e.http.get("/v1/models").json()["data"]  # the model a request would wake, and no wake for asking
    assert [(m["id"], m["status"]["value"]) for m in listed] == [("smollm2-135m", "sleeping")], listed
    assert e.http.get("/health").json()["stage"] == "sleeping"
    # the first request after the sleep loads the model again and is served (no 503)
    r = e.http.post("/v1/completions", json=ASK)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want
    body = e.http.get("/health").json()
    assert body["stage"] == "ready" and body["status"] == "ok" and _mapped(e.proc.pid, smollm_path)
    # asleep again, a configure that unloads the model ends the sleep: nothing is loaded by the next request
    _asleep(e)
    assert e.configure(model=None).status_code == 200
    assert e.http.get("/health").json()["stage"] == "idle"
    assert e.http.post("/v1/completions", json=ASK).json()["error"]["code"] == "no_model"


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {"content": "Hello world"}),
    ("/apply-template", {"messages": [{"role": "user", "content": "Hello world"}]}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hello world"}]}),
    ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "Hello world"}]}),
    ("/v1/responses/input_tokens", {"input": "Hello world"}),
])
def test_props_says_it_sleeps_and_a_request_that_needs_the_tokenizer_wakes_it(
        start_engine: Callable[..., Engine], path: str, body: dict[str, Any]) -> None:
    """llama-server's ``is_sleeping`` in ``/props``; tokenizing, a template's prompt and the token
    counts load the model again and are answered, as a generation is."""
    e = start_engine(defaults=DEFAULTS)
    e.wait_ready()
    awake = e.http.get("/props").json()
    assert awake["is_sleeping"] is False
    _asleep(e)
    assert e.http.get("/props").json()["is_sleeping"] is True
    r = e.http.post(path, json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer.get("tokens") or answer.get("prompt") or answer.get("input_tokens", 0) > 0, answer
    assert e.http.get("/props").json()["is_sleeping"] is False


def test_sleep_idle_seconds_set_at_runtime_puts_the_engine_to_sleep(start_engine: Callable[..., Engine],
                                                                     smollm_path: Path) -> None:
    e = start_engine(defaults={k: v for k, v in DEFAULTS.items() if k != "sleep_idle_seconds"})
    e.wait_ready()
    r = e.configure(sleep_idle_seconds=IDLE_S)  # T1: no reload, no restart
    assert r.json()["tier"] == "T1" and metric(e, "hydra_model_loads_total") == 1, r.text
    _asleep(e)


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    profiles = {"profiles": {"one": {"description": "one SmolLM2 engine that sleeps when idle",
                                     "engines": {"solo": {"model": "smollm2-135m"}}}}, "default": "one"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults=DEFAULTS, extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_front_door_routes_to_a_sleeping_engine_and_it_wakes(pool: tuple[Coordinator, Engine],
                                                            smollm_path: Path) -> None:
    c, e = pool
    chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6}
    want = c.http.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    es = c.wait_engines(lambda es: es["solo"].get("stage") == "sleeping", timeout=IDLE_S + 20,
                        what="the engine to report sleeping over the bus")
    assert es["solo"]["model"] == "smollm2-135m"
    assert not _mapped(e.proc.pid, smollm_path)
    r = c.http.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want
    c.wait_engines(lambda es: es["solo"].get("stage") == "ready", timeout=30)
    assert _mapped(e.proc.pid, smollm_path)

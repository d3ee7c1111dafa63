"""llama-server's /tokenize, /detokenize and /apply-template through the front door: forwarded to
an engine serving the model, the engine's own answers (and refusals) coming back as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

PROFILES = {"profiles": {"one": {"description": "one SmolLM2 engine",
                                 "engines": {"solo": {"model": "smollm2-135m", "params": {"n_parallel": 1}}}}},
            "default": "one"}


@pytest.fixture
def pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults={"n_ctx": 1024, "n_threads": 1},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_native_endpoints_through_the_front_door(pool: tuple[Coordinator, Engine]) -> None:
    c, e = pool
    direct = e.http.post("/tokenize", json={"content": "Hello there", "with_pieces": True}).json()
    via = c.http.post("/tokenize", json={"content": "Hello there", "with_pieces": True})
    assert via.status_code == 200 and via.json() == direct, via.text
    ids = [t["id"] for t in direct["tokens"]]
    named = c.http.post("/detokenize", json={"tokens": ids, "model": "smollm2-135m"})
    assert named.status_code == 200 and named.json() == {"content": "Hello there"}, named.text
    tmpl = c.http.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert tmpl.status_code == 200 and "Hi" in tmpl.json()["prompt"], tmpl.text
    # refusals: the front door's own (model), the engine's own (fields), never a 5xx
    for path, body, status, code in (
        ("/tokenize", {"content": "x", "model": "nope"}, 404, "model_not_found"),
        ("/tokenize", {"content": "x", "model": 7}, 400, "invalid_field"),
        ("/tokenize", {"content": 5}, 400, "invalid_field"),
        ("/detokenize", {"tokens": [-1]}, 400, "invalid_field"),
        ("/apply-template", {"messages": []}, 400, "invalid_field"),
    ):
        r = c.http.post(path, json=body)
        assert r.status_code == status and r.json()["error"]["code"] == code, (path, body, r.text)
    bad = c.http.post("/tokenize", content=b"{not json", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def test_native_completion_through_the_front_door(pool: tuple[Coordinator, Engine]) -> None:
    """/completion forwarded to the engine: the engine's answer, whole or streamed, with token-id
    prompts and return_tokens; bad fields refused at the front door by name, before any engine."""
    c, e = pool
    body = {"prompt": "1, 2, 3, 4,", "n_predict": 12, "temperature": 0, "return_tokens": True}
    direct = e.http.post("/completion", json=body).json()
    via = c.http.post("/completion", json={**body, "model": "smollm2-135m"})
    assert via.status_code == 200, via.text
    got = via.json()
    assert got["content"] == direct["content"] and got["tokens"] == direct["tokens"] and got["stop"] is True
    assert got["stop_type"] == "limit" and got["model"] == "smollm2-135m" and got["tokens_predicted"] == 12
    assert via.headers.get("x-hydra-generation")
    cut = c.http.post("/completion", json={**body, "stop": ["7"]}).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == "7" and "7" not in cut["content"]
    ids = e.http.post("/tokenize", json={"content": "1, 2, 3, 4,", "add_special": True}).json()["tokens"]
    by_ids = c.http.post("/completion", json={**body, "prompt": ids}).json()
    assert by_ids["content"] == direct["content"]
    with c.http.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    evs = [json.loads(b[len("data: "):]) for b in raw.split("\n\n") if b.strip()]
    assert evs[-1]["stop"] is True and all(ev["stop"] is False for ev in evs[:-1])
    assert "".join(ev["content"] for ev in evs) == direct["content"]
    for bad, field, status in (({"prompt": [-1]}, "prompt", 400), ({"prompt": "x", "n_probs": -1}, "n_probs", 400),
                               ({"prompt": "x", "temperature": "hot"}, "temperature", 400),
                               ({"prompt": [10**6]}, "prompt", 400),  # past the vocabulary: the engine's refusal
                               ({"prompt": "x", "model": "nope"}, "model", 404), ({}, "prompt", 400)):
        r = c.http.post("/completion", json=bad)
        assert r.status_code == status and r.json()["error"]["param"] == field, (bad, r.text)
    assert e.http.get("/livez").status_code == 200


def test_infill_and_prompt_progress_through_the_front_door(pool: tuple[Coordinator, Engine]) -> None:
    """/infill is checked at the front door and answered by the engine (SmolLM2 has no FIM tokens:
    its 501 comes back); a /completion stream's prompt_progress events pass as the engine writes them."""
    c, _ = pool
    r = c.http.post("/infill", json={"input_prefix": "def f():", "input_suffix": "", "n_predict": 4})
    assert r.status_code == 501 and "not supported by this model" in r.json()["error"]["message"], r.text
    for bad, field in (({"input_suffix": ""}, "input_prefix"), ({"input_prefix": "", "input_suffix": "",
                                                                 "input_extra": [{"file": "a"}]}, "input_extra")):
        r = c.http.post("/infill", json=bad)
        assert r.status_code == 400 and field in r.text, (bad, r.text)
    body = {"prompt": "1, 2, 3, 4,", "n_predict": 4, "temperature": 0, "return_progress": True, "stream": True}
    with c.http.stream("POST", "/completion", json=body) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    evs = [json.loads(b[len("data: "):]) for b in raw.split("\n\n") if b.strip()]
    progress = [ev["prompt_progress"] for ev in evs if "prompt_progress" in ev]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] == evs[-1]["tokens_evaluated"]
    r = c.http.post("/completion", json={**body, "return_progress": "yes"})
    assert r.status_code == 400 and "return_progress" in r.text


def test_one_api_key_for_the_pool(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """HYDRA_API_KEY on the coordinator and its engine: inference at either door needs the key, the
    front door forwards the client's key to the engine, health and the control surfaces do not ask."""
    key = "pool-key-" + "x" * 20
    env = {"HYDRA_API_KEY": key}
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5, env=env)
    c.wait_ready()
    try:
        e = start_engine(name="solo", defaults={"n_ctx": 1024, "n_threads": 1},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)}, env=env)
        c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
        auth = {"Authorization": f"Bearer {key}"}
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for http in (c.http, e.http):
            assert http.post("/v1/chat/completions", json=chat).status_code == 401
            assert http.post("/v1/chat/completions", json=chat, headers=auth).status_code == 200
            assert http.get("/health").status_code == 200
        assert c.http.post("/tokenize", json={"content": "x"}).status_code == 401
        assert c.http.post("/tokenize", json={"content": "x"}, headers=auth).status_code == 200  # forwarded with it
        native = {"prompt": "Hi", "n_predict": 2}
        assert c.http.post("/completion", json=native).status_code == 401
        assert c.http.post("/completion", json=native, headers=auth).status_code == 200
        assert e.http.get("/control/config").status_code == 200  # the engine's own credentials (none here)
    finally:
        c.stop()


def test_both_daemons_describe_their_doors_in_openapi(pool: tuple[Coordinator, Engine]) -> None:
    """GET /openapi.json at the front door and at the engine: every door each serves, the chat body as
    the parser's model, open like /health (no key, no token)."""
    c, e = pool
    front = c.http.get("/openapi.json")
    assert front.status_code == 200, front.text
    paths = front.json()["paths"]
    for path in ("/v1/chat/completions", "/v1/messages", "/completion", "/infill", "/tokenize", "/v1/embeddings",
                 "/admin/engines", "/admin/profile", "/openapi.json"):
        assert path in paths, path
    assert "messages" in paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]
    engine = e.http.get("/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/completion", "/control/configure", "/slots/{slot}/state", "/props"):
        assert path in engine, path
    assert "put" in engine["/slots/{slot}/state"] and "get" in engine["/slots/{slot}/state"]


TWO = {"profiles": {"two": {"description": "two SmolLM2 engines",
                            "engines": {"a": {"model": "smollm2-135m", "params": {"n_parallel": 1}},
                                        "b": {"model": "smollm2-135m", "params": {"n_parallel": 1}}}}},
       "default": "two"}


def test_a_request_an_engine_never_received_goes_to_the_next(tmp_path: Path, smollm_path: Path,
                                                             start_engine: Callable[..., Engine]) -> None:
    """``a`` (first by name when both are idle) dies; before the pool has noticed, a /tokenize that would
    go to it is sent to ``b``, as a chat is retried before its first token."""
    c = Coordinator(tmp_path, profiles=TWO, heartbeat_interval_s=2.0)
    try:
        c.wait_ready()
        engines = {n: start_engine(name=n, defaults={"n_ctx": 1024, "n_threads": 1},
                                   extra={"bus": c.engine_bus(heartbeat_interval_s=2.0)}) for n in ("a", "b")}
        c.wait_serving({"a": "smollm2-135m", "b": "smollm2-135m"}, timeout=120)
        engines["a"].proc.kill()
        engines["a"].proc.wait(10)
        r = c.http.post("/tokenize", json={"content": "Hello world"})
        assert c.engines()["a"]["alive"], "the pool noticed first: this test shows nothing"
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == engines["b"].http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    finally:
        c.stop()

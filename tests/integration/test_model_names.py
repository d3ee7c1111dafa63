"""Model names as llama-server treats them, at both doors, on real engines and a real coordinator.

- An engine serves any name with its one model (test_llama_server_cli.py); with
  ``http.strict_model_names`` only the model's names: its registry key, file name and stem, and the
  ``aliases`` its registry entry lists.
- The front door: no ``model`` in a pool serving one model is that model; with several, the
  coordinator's ``default_model`` or a 400 naming them; an unknown name is a 404 naming the known
  ones, or with ``default_model`` set is served by it, the answer saying so in
  ``X-Hydra-Default-Model``. Registry aliases name their model there too."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import yaml

from tests.support.coordinator import Coordinator
from tests.support.engine import REGISTRY, Engine

pytestmark = pytest.mark.model

SMOL, GEMMA = "smollm2-135m", "gemma3-270m"
PROFILES = {"profiles": {"two": {"description": "SmolLM2 on a, Gemma-3 on b",
                                 "engines": {"a": {"model": SMOL, "params": {"n_parallel": 2}},
                                             "b": {"model": GEMMA, "params": {"n_parallel": 2}}}}},
            "default": "two"}


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """The shipped registry, SmolLM2's entry with two aliases a client might send."""
    data = yaml.safe_load(REGISTRY.read_text())
    data["models"][SMOL]["aliases"] = ["gpt-4o-mini", "my-model"]
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Pool:
    def __init__(self, tmp: Path, registry: Path, start_engine: Callable[..., Engine], **extra: Any) -> None:
        self.c = Coordinator(tmp, profiles=PROFILES, heartbeat_interval_s=0.5, extra={"registry": str(registry),
                                                                                      **extra})
        self.c.wait_ready()
        self._start, self.registry = start_engine, registry
        self.engines: dict[str, Engine] = {}

    def engine(self, name: str, **http: Any) -> Engine:
        e = self._start(name=name, defaults={"n_ctx": 1024, "n_threads": 1, "temperature": 0},
                        extra={"bus": self.c.engine_bus(heartbeat_interval_s=0.5), "registry": str(self.registry),
                               "http": http})
        self.engines[name] = e
        return e


@pytest.fixture
def pools(tmp_path: Path, smollm_path: Path, gemma_path: Path, registry: Path,
          start_engine: Callable[..., Engine]) -> Iterator[Callable[..., Pool]]:
    made: list[Pool] = []

    def make(**extra: Any) -> Pool:
        made.append(Pool(tmp_path, registry, start_engine, **extra))
        return made[-1]

    yield make
    for p in made:
        p.c.stop()


def chat(http: httpx.Client, model: str | None) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
    if model is not None:
        body["model"] = model
    return http.post("/v1/chat/completions", json=body)


def refused(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == "model", error
    for w in words:
        assert w in error["message"], (w, error)


def test_one_model_then_two_without_a_default(pools: Callable[..., Pool]) -> None:
    p = pools()
    a = p.engine("a", strict_model_names=True)
    p.c.wait_serving({"a": SMOL}, timeout=120)

    # one model served: a request without a model is served by it, an alias names it at both doors
    for name in (None, SMOL, "gpt-4o-mini", "my-model", "SmolLM2-135M-Instruct.Q4_1.gguf"):
        r = chat(p.c.http, name)
        assert r.status_code == 200 and r.json()["model"] == SMOL, (name, r.text)
        assert "x-hydra-default-model" not in r.headers
    assert p.c.http.post("/tokenize", json={"content": "hi"}).status_code == 200
    assert p.c.http.post("/tokenize", json={"content": "hi", "model": "my-model"}).status_code == 200
    refused(chat(p.c.http, "nope"), 404, "'nope'", SMOL, GEMMA)  # the registry's and the served
    listed = {m["id"]: m for m in p.c.http.get("/v1/models").json()["data"]}
    assert set(listed) == {SMOL} and {"gpt-4o-mini", "my-model"} <= set(listed[SMOL]["aliases"])
    # the engine, strict: its registry aliases answer, another name does not
    for name in ("gpt-4o-mini", "my-model", SMOL):
        assert chat(a.http, name).status_code == 200, name
    refused(chat(a.http, "gpt-4"), 404, "'gpt-4'", SMOL, "strict_model_names")
    assert {"gpt-4o-mini", "my-model"} <= set(a.http.get("/v1/models").json()["data"][0]["aliases"])

    # two models served and no default_model: a request must name one
    p.engine("b")
    p.c.wait_serving({"a": SMOL, "b": GEMMA}, timeout=120)
    refused(chat(p.c.http, None), 400, "several models", SMOL, GEMMA)
    refused(p.c.http.post("/tokenize", json={"content": "hi"}), 400, SMOL, GEMMA)
    refused(chat(p.c.http, "gpt-4"), 404, "'gpt-4'", SMOL, GEMMA)
    for name, engine in ((GEMMA, "b"), ("gpt-4o-mini", "a")):
        r = chat(p.c.http, name)
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == engine, (name, r.text)


def test_a_default_model_serves_what_names_no_known_model(pools: Callable[..., Pool]) -> None:
    p = pools(default_model="my-model")  # an alias of SmolLM2's entry
    p.engine("a")
    p.engine("b")
    p.c.wait_serving({"a": SMOL, "b": GEMMA}, timeout=120)
    for name in (None, "gpt-4", "claude-sonnet-4-5"):
        r = chat(p.c.http, name)
        assert r.status_code == 200, (name, r.text)
        assert r.headers["x-hydra-default-model"] == SMOL and r.headers["x-hydra-engine"] == "a"
        assert r.json()["model"] == SMOL
    named = chat(p.c.http, GEMMA)
    assert named.status_code == 200 and named.headers["x-hydra-engine"] == "b"
    assert "x-hydra-default-model" not in named.headers
    # Anthropic's door and llama-server's /completion take the same route
    m = p.c.http.post("/v1/messages", json={"model": "claude-sonnet-4-5", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "Hi"}]})
    assert m.status_code == 200 and m.headers["x-hydra-default-model"] == SMOL and m.json()["model"] == SMOL
    native = p.c.http.post("/completion", json={"prompt": "Hi", "n_predict": 2})
    assert native.status_code == 200 and native.headers["x-hydra-default-model"] == SMOL
    # the doors forwarded over HTTP say so too
    tok = p.c.http.post("/tokenize", json={"content": "hi", "model": "gpt-4"})
    assert tok.status_code == 200 and tok.headers["x-hydra-default-model"] == SMOL
    assert p.c.http.post("/tokenize", json={"content": "hi", "model": GEMMA}).headers.get(
        "x-hydra-default-model") is None

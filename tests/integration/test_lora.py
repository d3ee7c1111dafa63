"""LoRA adapters and control vectors on a real engine serving SmolLM2-135M, with a tiny LoRA and a control
vector written in the test with the ``gguf`` package (tests/support/adapters.py): random weights, large
enough that greedy answers change.

What is shown: an adapter at scale 0 answers as the base model (the same model reloaded without it);
a nonzero scale, asked by a request (llama-server's ``lora``) or set for every request by POST
/lora-adapters, changes the answer without a reload (the load counter stays); requests of different
scales running at once each get the answer they get alone (a step never mixes adapter sets) and never
reuse each other's KV; a control vector changes answers and at scale 0 does not; a file that is missing or
made for another model fails the load naming its parameter while the serving model goes on; and the
front door carries a request's ``lora`` to the engine.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from hydrad.engine import gguf_meta
from tests.support.adapters import make_control_vector, make_lora
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine, metric

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
BASE = {"model": "smollm2-135m", "n_ctx": 1024, "n_parallel": 2, "n_threads": 1, "temperature": 0}


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    from tests.support.engine import SMOLLM, models_dir

    path = models_dir() / SMOLLM
    if not path.is_file():
        pytest.skip(f"{SMOLLM} is not in the models directory")
    meta = gguf_meta.metadata(path)
    return int(meta["llama.embedding_length"]), int(meta["llama.block_count"])


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int]) -> Path:
    return make_lora(tmp_path_factory.mktemp("lora") / "tiny-lora.gguf", *shape, spread=1.0)


@pytest.fixture(scope="module")
def cvec(tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int]) -> Path:
    n_embd, n_layer = shape
    return make_control_vector(tmp_path_factory.mktemp("cvec") / "tiny-cvec.gguf", n_embd, range(1, n_layer),
                               spread=0.3)


def complete(http: httpx.Client, prompt: str = PROMPT, **kw: Any) -> dict[str, Any]:
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 12, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def text(http: httpx.Client, **kw: Any) -> str:
    return complete(http, **kw)["content"]  # type: ignore[no-any-return]


def loaded(e: Engine, **payload: Any) -> None:
    r = e.configure(**payload)
    assert r.status_code == 200, r.text
    assert r.json()["load"]["phase"] == "done", r.text


def refused_load(e: Engine, **payload: Any) -> dict[str, Any]:
    r = e.configure(**payload)
    assert r.status_code == 422, r.text
    return r.json()["error"]  # type: ignore[no-any-return]


def test_scales_change_answers_without_a_reload(start_engine: Callable[..., Engine], lora: Path) -> None:
    e = start_engine(defaults={**BASE, "lora_adapters": [{"path": str(lora), "scale": 1.0}],
                               "lora_init_without_apply": True})
    e.wait_ready()
    assert e.http.get("/lora-adapters").json() == [{"id": 0, "path": str(lora), "scale": 0.0}]
    at_zero = text(e.http)
    loads = metric(e, "hydra_model_loads_total")
    one = text(e.http, lora=[{"id": 0, "scale": 1.0}])
    half = text(e.http, lora=[{"id": 0, "scale": 0.5}])
    assert len({at_zero, one, half}) == 3, (at_zero, one, half)
    assert text(e.http, lora=[{"id": 0, "scale": 0}]) == at_zero
    # the OpenAI doors take the same field
    r = e.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                             "lora": [{"id": 0, "scale": 1.0}]})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == one, r.text

    # POST /lora-adapters: the scales of requests naming none; an empty list in a request means those too
    r = e.http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert e.http.get("/lora-adapters").json()[0]["scale"] == 1.0
    assert text(e.http) == one and text(e.http, lora=[]) == one
    assert text(e.http, lora=[{"id": 0, "scale": 0.5}]) == half
    assert e.http.post("/lora-adapters", json=[]).status_code == 200  # every adapter back to 0
    assert text(e.http) == at_zero
    assert metric(e, "hydra_model_loads_total") == loads  # nothing was reloaded

    for body, says in [([{"id": 1, "scale": 1}], "no adapter 1"), ({"id": 0}, "array"),
                       ([{"id": -1, "scale": 1}], "lora"), ([{"id": 0, "scale": float("1e9")}], "lora")]:
        r = e.http.post("/lora-adapters", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora" and says in r.text, r.text
    r = e.http.post("/completion", json={"prompt": PROMPT, "lora": [{"id": 3, "scale": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora" and "no adapter 3" in r.text, r.text

    # scale 0 is the base model: the same answer from the model loaded without the adapter
    loaded(e, lora_adapters=[])  # (None would fall back to the YAML layer's)
    assert e.http.get("/lora-adapters").json() == []
    assert text(e.http) == at_zero
    r = e.http.post("/completion", json={"prompt": PROMPT, "lora": [{"id": 0, "scale": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora", r.text


def test_requests_of_different_scales_never_share_a_step_or_a_prefix(start_engine: Callable[..., Engine],
                                                                    lora: Path) -> None:
    e = start_engine(defaults={**BASE, "lora_adapters": [{"path": str(lora), "scale": 0.0}]})
    e.wait_ready()
    alone = {s: complete(e.http, n_predict=24, lora=[{"id": 0, "scale": s}])["content"] for s in (0.0, 1.0)}
    assert alone[0.0] != alone[1.0]
    # a prompt again under the same scales reuses its KV, under other scales nothing of it
    prompt = "Water boils at a temperature of"
    first = complete(e.http, prompt, n_predict=4, lora=[{"id": 0, "scale": 1.0}])
    again = complete(e.http, prompt, n_predict=4, lora=[{"id": 0, "scale": 1.0}])
    other = complete(e.http, prompt, n_predict=4, lora=[{"id": 0, "scale": 0.0}])
    assert first["tokens_cached"] == 0 and again["tokens_cached"] > 0, (first, again)
    assert other["tokens_cached"] == 0 and other["content"] != again["content"], (again, other)
    switches = metric(e, "hydra_lora_switches_total")
    got: dict[float, list[str]] = {0.0: [], 1.0: []}
    barrier = threading.Barrier(4)

    def ask(scale: float) -> None:
        with httpx.Client(base_url=e.url, timeout=120) as http:
            barrier.wait()
            got[scale].append(complete(http, n_predict=24, lora=[{"id": 0, "scale": scale}],
                                       cache_prompt=False)["content"])

    threads = [threading.Thread(target=ask, args=(s,)) for s in (0.0, 1.0, 0.0, 1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == {0.0: [alone[0.0]] * 2, 1.0: [alone[1.0]] * 2}
    assert metric(e, "hydra_lora_switches_total") > switches  # they ran at once, taking turns


def test_a_control_vector_changes_answers_and_at_scale_0_does_not(start_engine: Callable[..., Engine],
                                                                 cvec: Path) -> None:
    e = start_engine(defaults=BASE)
    e.wait_ready()
    base = text(e.http)
    loaded(e, control_vectors=[{"path": str(cvec), "scale": 1.0}])
    steered = text(e.http)
    assert steered != base
    # the range restricts it: on the late layers alone it does not give the full vector's answer, on the
    # early ones it still moves the answer off the base model's
    loaded(e, control_vector_layer_range=[20, 0])  # from layer 20 to the last
    assert text(e.http) != steered
    loaded(e, control_vector_layer_range=[0, 12])  # from the first layer to layer 12
    assert text(e.http) != base
    loaded(e, control_vectors=[{"path": str(cvec), "scale": 0.0}], control_vector_layer_range=None)
    assert text(e.http) == base


def test_a_bad_adapter_fails_the_load_naming_its_parameter(start_engine: Callable[..., Engine], lora: Path,
                                                          tmp_path: Path, shape: tuple[int, int]) -> None:
    e = start_engine(defaults=BASE)
    e.wait_ready()
    base = text(e.http)
    n_embd, n_layer = shape
    other_arch = make_lora(tmp_path / "gemma-lora.gguf", n_embd, n_layer, arch="gemma3")
    narrow = make_lora(tmp_path / "narrow-lora.gguf", 64, 2)
    narrow_cvec = make_control_vector(tmp_path / "narrow-cvec.gguf", 64, range(1, 3))
    for payload, param, says in [
        ({"lora_adapters": [{"path": "no-such-adapter.gguf"}]}, "lora_adapters", "no such file: no-such-adapter.gguf"),
        ({"lora_adapters": [{"path": str(lora)}, {"path": str(other_arch)}]}, "lora_adapters",
         "lora_adapters[1]: llama.cpp refused gemma-lora.gguf"),
        ({"lora_adapters": [{"path": str(narrow)}]}, "lora_adapters", "incorrect shape"),
        ({"control_vectors": [{"path": str(narrow_cvec)}]}, "control_vectors", f"not {n_embd} F32 values"),
        ({"control_vectors": [{"path": str(lora)}]}, "control_vectors", "direction.<layer>"),
    ]:
        err = refused_load(e, **payload)
        assert err["code"] == "load_failed" and err["param"] == param and says in err["message"], (payload, err)
        assert text(e.http) == base  # the serving model goes on
    for payload, param in [({"lora_adapters": [{"path": str(lora), "scale": 5000.0}]}, "lora_adapters"),
                           ({"lora_adapters": [{"path": str(lora)}] * 17}, "lora_adapters"),
                           ({"control_vector_layer_range": [9, 3]}, "control_vector_layer_range")]:
        r = e.configure(**payload)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text


@pytest.fixture
def pool(tmp_path: Path, lora: Path, start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    profiles = {"profiles": {"one": {"description": "one SmolLM2 engine with a LoRA adapter",
                                     "engines": {"solo": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
                "default": "one"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5)
    c.wait_ready()
    e = start_engine(name="solo", defaults={**BASE, "lora_adapters": [{"path": str(lora), "scale": 0.0}]},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_the_front_door_carries_a_requests_lora(pool: tuple[Coordinator, Engine]) -> None:
    c, e = pool
    ask = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 12, "temperature": 0}
    answers = {}
    for scale in (0.0, 1.0):
        body = {**ask, "lora": [{"id": 0, "scale": scale}]}
        at_engine = e.http.post("/v1/chat/completions", json=body)
        at_front = c.http.post("/v1/chat/completions", json=body)
        assert at_engine.status_code == at_front.status_code == 200, (at_engine.text, at_front.text)
        answers[scale] = at_front.json()["choices"][0]["message"]["content"]
        assert answers[scale] == at_engine.json()["choices"][0]["message"]["content"]
    assert answers[0.0] != answers[1.0]
    r = c.http.post("/v1/chat/completions", json={**ask, "lora": [{"id": 7, "scale": 1.0}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora", r.text


def test_the_front_door_serves_an_engine_steered_by_a_control_vector(pool: tuple[Coordinator, Engine],
                                                                     cvec: Path) -> None:
    c, e = pool
    base = text(c.http, model="smollm2-135m")
    loaded(e, control_vectors=[{"path": str(cvec), "scale": 1.0}])  # a T3 reload of the serving engine
    c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
    steered = text(c.http, model="smollm2-135m")
    assert steered != base
    assert steered == text(e.http)

"""Embeddings on a real engine (SmolLM2, pooling mean): OpenAI's /v1/embeddings and llama-server's
/embedding, their shapes and statuses, the vectors' properties, every bad field refused by name,
an engine without embeddings saying how to turn them on, and the front door passing them through."""

from __future__ import annotations

import base64
import math
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

EMBED = {"embeddings": True, "pooling": "mean"}
TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics describes the strong force.", "Hello"]
N_EMBD = 576  # SmolLM2-135M


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    from tests.support.engine import SMOLLM, models_dir

    if not (models_dir() / SMOLLM).is_file():
        pytest.skip("SmolLM2 is missing (scripts/setup fetches it)")
    e = Engine(tmp_path_factory.mktemp("embed"), defaults={"model": "smollm2-135m", "temperature": 0, "n_ctx": 1024,
                                                           "n_parallel": 2, "n_ubatch": 256, "n_threads": 1, **EMBED})
    try:
        e.wait_ready(120)
        yield e
    finally:
        e.stop()


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _one(e: Engine, text: str | list[int], **kw: Any) -> list[float]:
    r = e.http.post("/v1/embeddings", json={"input": text, **kw})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]  # type: ignore[no-any-return]


def test_openai_shape_and_vectors(engine: Engine) -> None:
    r = engine.http.post("/v1/embeddings", json={"input": TEXTS, "model": "smollm2-135m"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "smollm2-135m"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and all(d["object"] == "embedding" for d in body["data"])
    vectors = [d["embedding"] for d in body["data"]]
    assert all(len(v) == N_EMBD and all(isinstance(x, float) for x in v) for v in vectors)
    assert all(abs(_norm(v) - 1.0) < 1e-4 for v in vectors)  # L2-normalised, as llama-server's
    n_tokens = sum(len(engine.http.post("/tokenize", json={"content": t, "add_special": True}).json()["tokens"])
                   for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    # the same text gives the same vector, alone or in a batch; different texts differ
    for text, batched in zip(TEXTS, vectors):
        alone = _one(engine, text)
        assert max(abs(a - b) for a, b in zip(alone, batched)) < 1e-4
    assert _one(engine, TEXTS[0]) == _one(engine, TEXTS[0])
    cos = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    assert cos < 0.999
    # token ids embed as their text does
    ids = engine.http.post("/tokenize", json={"content": TEXTS[0], "add_special": True}).json()["tokens"]
    assert max(abs(a - b) for a, b in zip(_one(engine, ids), vectors[0])) < 1e-4
    mixed = engine.http.post("/v1/embeddings", json={"input": [ids, TEXTS[1]]}).json()["data"]
    assert max(abs(a - b) for a, b in zip(mixed[1]["embedding"], vectors[1])) < 1e-4


def test_llama_servers_mixed_prompts_and_objects_of_text(engine: Engine) -> None:
    """llama-server's other input shapes: token ids with text pieces (each piece tokenized where it
    stands, the first with the model's own start, joined: the vector of the whole text), and objects
    of text ({"prompt_string"}, {"content": [text parts]}), alone or in a list, as their text embeds."""
    def ids(text: str, special: bool) -> list[int]:
        return engine.http.post("/tokenize", json={"content": text, "add_special": special}).json()["tokens"]

    head, tail = "The quick brown fox", " jumps over the lazy dog."
    whole = _one(engine, ids(head, True) + ids(tail, False))
    for mixed in ([head, *ids(tail, False)], [*ids(head, True), tail]):
        assert max(abs(a - b) for a, b in zip(_one(engine, mixed), whole)) < 1e-4, mixed
    text = _one(engine, head + tail)
    for obj in ({"prompt_string": head + tail}, {"content": [{"type": "text", "text": head},
                                                             {"type": "text", "text": tail}]}):
        assert max(abs(a - b) for a, b in zip(_one(engine, obj), text)) < 1e-4, obj
    r = engine.http.post("/v1/embeddings", json={"input": [head + tail, {"prompt_string": head + tail}, [head, tail]]})
    assert r.status_code == 200 and len(r.json()["data"]) == 3, r.text
    for bad in ({"content": head}, {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}):
        r = engine.http.post("/v1/embeddings", json={"input": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text


def test_base64_and_normalisation(engine: Engine) -> None:
    floats = _one(engine, TEXTS[0])
    r = engine.http.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == N_EMBD and max(abs(a - b) for a, b in zip(decoded, floats)) < 1e-6
    plain = _one(engine, TEXTS[0], embd_normalize=-1)
    assert _norm(plain) > 2  # raw mean-pooled vector
    assert max(abs(a / _norm(plain) - b) for a, b in zip(plain, floats)) < 1e-5
    taxicab = _one(engine, TEXTS[0], embd_normalize=1)
    assert abs(sum(abs(x) for x in taxicab) - 1.0) < 1e-4
    assert len(_one(engine, TEXTS[0], dimensions=N_EMBD)) == N_EMBD


def test_native_shape(engine: Engine) -> None:
    r = engine.http.post("/embedding", json={"content": TEXTS[:2]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and [x["index"] for x in body] == [0, 1]
    assert all(len(x["embedding"]) == 1 and len(x["embedding"][0]) == N_EMBD for x in body)
    oai = engine.http.post("/v1/embeddings", json={"input": TEXTS[:2]}).json()["data"]
    for native, openai in zip(body, oai):
        assert max(abs(a - b) for a, b in zip(native["embedding"][0], openai["embedding"])) < 1e-6
    one = engine.http.post("/embeddings", json={"content": TEXTS[2]}).json()
    assert len(one) == 1 and one[0]["index"] == 0 and len(one[0]["embedding"][0]) == N_EMBD
    via_input = engine.http.post("/embedding", json={"input": TEXTS[2]}).json()
    assert via_input == one


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/embeddings", {}, "input"), ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": []}, "input"), ("/v1/embeddings", {"input": [""]}, "input"),
    ("/v1/embeddings", {"input": 5}, "input"), ("/v1/embeddings", {"input": None}, "input"),
    ("/v1/embeddings", {"input": [[]]}, "input"), ("/v1/embeddings", {"input": [-1]}, "input"),
    ("/v1/embeddings", {"input": [10**9]}, "input"), ("/v1/embeddings", {"input": [1, None]}, "input"),
    ("/v1/embeddings", {"input": [True]}, "input"), ("/v1/embeddings", {"input": [1.5]}, "input"),
    ("/v1/embeddings", {"input": [{"text": "x"}]}, "input"), ("/v1/embeddings", {"input": ["a"] * 2049}, "input"),
    ("/v1/embeddings", {"input": "word " * 400}, "input"),  # more tokens than n_ubatch (256)
    ("/v1/embeddings", {"input": ["word " * 200] * 400}, "input"),  # more than 65,536 tokens in all
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 256}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": "576"}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "embd_normalize": 99}, "embd_normalize"),
    ("/v1/embeddings", {"input": "x", "embd_normalize": "2"}, "embd_normalize"),
    ("/v1/embeddings", {"input": "x", "model": 7}, "model"), ("/v1/embeddings", {"input": "x", "user": 1}, "user"),
    ("/embedding", {}, "content"), ("/embedding", {"content": ""}, "content"),
    ("/embedding", {"content": {"a": 1}}, "content"), ("/embedding", {"content": "x", "input": "y"}, "content"),
    ("/embedding", {"content": "x", "encoding_format": "float"}, "encoding_format"),
    ("/embedding", {"content": "x", "extra": 1}, "extra"),
]


@pytest.mark.parametrize("path, body, field", BAD, ids=[f"{p}:{f}:{i}" for i, (p, _, f) in enumerate(BAD)])
def test_bad_fields_are_refused_by_name(engine: Engine, path: str, body: dict[str, Any], field: str) -> None:
    r = engine.http.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_any_model_name_bad_json_and_chat_afterwards(engine: Engine) -> None:
    # any name is served by the engine's one model, as llama-server serves it (test_model_names.py: strict)
    r = engine.http.post("/v1/embeddings", json={"input": "x", "model": "nope"})
    assert r.status_code == 200 and r.json()["model"] == "smollm2-135m", r.text
    r = engine.http.post("/v1/embeddings", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    chat = engine.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                          "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
    health = engine.http.get("/health").json()
    assert health["status"] == "ok" and health["slots"]["busy"] == 0 and health["slots"]["queued"] == 0


def test_embeddings_while_generating(engine: Engine) -> None:
    """Embeddings are computed between the steps of a running generation: both answer, and the
    vector is the one computed alone."""
    import concurrent.futures as cf

    alone = _one(engine, TEXTS[1])
    with cf.ThreadPoolExecutor(2) as pool:
        chat = pool.submit(engine.http.post, "/v1/completions",
                           json={"prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True})
        vectors = [_one(engine, TEXTS[1]) for _ in range(3)]
        assert chat.result().status_code == 200
    assert all(max(abs(a - b) for a, b in zip(v, alone)) < 1e-4 for v in vectors)


def test_without_embeddings_it_says_how_to_turn_them_on(smollm_engine: Engine) -> None:
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/embedding", {"content": "x"})):
        r = smollm_engine.http.post(path, json=body)
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["code"] == "embeddings_disabled" and "embeddings: true" in err["message"]
        assert "pooling: mean" in err["message"]
    assert smollm_engine.http.get("/livez").status_code == 200


def test_pooling_none_gives_token_vectors(start_engine: Callable[..., Engine]) -> None:
    """pooling none (what a generative GGUF says): /embedding gives one raw vector per token, and
    /v1/embeddings refuses, as llama-server does."""
    e = start_engine(defaults={"model": "smollm2-135m", "n_ctx": 512, "n_parallel": 1, "n_threads": 1,
                               "embeddings": True})
    e.wait_ready(120)
    r = e.http.post("/v1/embeddings", json={"input": "Hello there"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "pooling_none", r.text
    n = len(e.http.post("/tokenize", json={"content": "Hello there", "add_special": True}).json()["tokens"])
    body = e.http.post("/embedding", json={"content": "Hello there"}).json()
    assert len(body) == 1 and len(body[0]["embedding"]) == n
    assert all(len(v) == N_EMBD for v in body[0]["embedding"]) and _norm(body[0]["embedding"][0]) > 2


PROFILES = {"profiles": {"one": {"description": "one SmolLM2 engine with embeddings",
                                 "engines": {"solo": {"model": "smollm2-135m",
                                                      "params": {"n_parallel": 1, **EMBED}}}}},
            "default": "one"}


def test_through_the_front_door(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        e = start_engine(name="solo", defaults={"n_ctx": 1024, "n_threads": 1},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                       and es["solo"].get("stage") == "ready", timeout=120)
        direct = e.http.post("/v1/embeddings", json={"input": TEXTS}).json()
        via = c.http.post("/v1/embeddings", json={"input": TEXTS, "model": "smollm2-135m"})
        assert via.status_code == 200 and via.json() == direct, via.text
        native = c.http.post("/embedding", json={"content": TEXTS[0]})
        assert native.status_code == 200 and native.json() == e.http.post("/embedding", json={"content": TEXTS[0]}).json()
        for path, body, status, param in (
            ("/v1/embeddings", {"input": "x", "model": "nope"}, 404, "model"),
            ("/v1/embeddings", {"input": []}, 400, "input"),
            ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
            ("/embedding", {"content": 5}, 400, "content"),
        ):
            r = c.http.post(path, json=body)
            assert r.status_code == status and r.json()["error"]["param"] == param, (path, body, r.text)
    finally:
        c.stop()

"""Reranking (llama-server's ``/rerank``, ``/v1/rerank``, ``/reranking``) on real engines and through the
coordinator's front door, with tiny Qwen3-layout rerankers written here (scripts/make_tiny_reranker.py:
random weights, a classification head, rank pooling), against llama.cpp's own llama-server started with
``--reranking`` on the same files.

Checked: each document's score is the one it gets alone (scores per document, not per batch), results come
most relevant first and ``top_n`` keeps the first ones; Jina's answer (``documents``: ``{model, object,
usage, results: [{index, relevance_score}]}``) and TEI's (``texts``: a list of ``{index, score, text?}``)
have llama-server's shapes, orders, scores (to float rounding) and token counts, for a model with a rerank
template and for one without (the query and document tokens joined); the front door answers as the engine;
an engine whose model is not a reranker answers 501 naming how to serve it, at both doors, and one told to
rank a model that has no head fails its load saying why; bad fields are 400s naming them; a prompt longer
than the embedding context is refused naming the document; the embeddings endpoints of a reranking engine
refuse by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from tests.support import llamaserver
from tests.support.coordinator import Coordinator
from tests.support.engine import REGISTRY, SMOLLM, Engine, free_port, models_dir
from tests.support.scripts import load_script
from tests.support.wait import eventually

pytestmark = pytest.mark.model

TEMPLATE = "<|im_start|>query: {query}\ndocument: {document}<|im_end|>"
QUERY = "What is a panda?"
DOCS = ["hi", "The giant panda is a bear species endemic to China.", "it is a bear", "Pandas eat bamboo.",
        "The stock market fell today.", "A red panda is not a bear."]
N_UBATCH = 128


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny rerankers from one read of SmolLM2's tokenizer: one with a rerank template, one without."""
    if not (models_dir() / SMOLLM).is_file():
        pytest.skip(f"model file {SMOLLM} is missing (scripts/setup fetches it)")
    make = load_script("make_tiny_reranker")
    tokenizer = load_script("make_tiny_moe").read_tokenizer(models_dir() / SMOLLM)
    out = tmp_path_factory.mktemp("rerankers")
    paths = {"template": out / "rr-template.gguf", "plain": out / "rr-plain.gguf"}
    make.make(paths["template"], models_dir() / SMOLLM, rerank_template=TEMPLATE, tokenizer=tokenizer)
    make.make(paths["plain"], models_dir() / SMOLLM, seed=1, tokenizer=tokenizer)
    return paths


class Pool:
    """A coordinator with two engines: ``rr`` serving the templated reranker (embeddings, rank pooling)
    and ``lm`` serving SmolLM2 (no embeddings)."""

    def __init__(self, tmp: Path, rerankers: dict[str, Path]) -> None:
        registry = yaml.safe_load(REGISTRY.read_text())
        registry["models"]["tiny-reranker"] = {"path": str(rerankers["template"]), "arch": "qwen3",
                                               "description": "a tiny random reranker"}
        registry["models"]["smollm2-135m"]["path"] = str(models_dir() / SMOLLM)
        reg = tmp / "models.yaml"
        reg.write_text(yaml.safe_dump(registry))
        rank = {"embeddings": True, "pooling": "rank", "n_ubatch": N_UBATCH, "n_batch": N_UBATCH}
        profiles = {"profiles": {"two": {"description": "a reranker and a generator", "engines": {
            "rr": {"model": "tiny-reranker", "params": rank}, "lm": {"model": "smollm2-135m"}}}}, "default": "two"}
        self.coordinator = Coordinator(tmp, profiles=profiles, heartbeat_interval_s=0.5, extra={"registry": str(reg)})
        self.coordinator.wait_ready()
        common = {"n_ctx": 512, "n_parallel": 1, "n_threads": 1}
        self.rr = Engine(tmp, name="rr", defaults={**common, **rank, "model": "tiny-reranker"},
                         extra={"registry": str(reg), "bus": self.coordinator.engine_bus(heartbeat_interval_s=0.5)})
        self.lm = Engine(tmp, name="lm", defaults={**common, "model": "smollm2-135m"},
                         extra={"registry": str(reg), "bus": self.coordinator.engine_bus(heartbeat_interval_s=0.5)})
        self.coordinator.wait_serving({"rr": "tiny-reranker", "lm": "smollm2-135m"}, timeout=180)

    def stop(self) -> None:
        self.rr.stop()
        self.lm.stop()
        self.coordinator.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, rerankers: dict[str, Path]) -> Iterator[Pool]:
    p = Pool(tmp_path_factory.mktemp("pool"), rerankers)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def llama_servers(rerankers: dict[str, Path]) -> Iterator[dict[str, httpx.Client]]:
    args = llamaserver.start_args(n_ctx=512, extra=["--reranking", "-ub", str(N_UBATCH), "-b", str(N_UBATCH)])
    with llamaserver.running(rerankers["template"], *args) as template, \
            llamaserver.running(rerankers["plain"], *args) as plain:
        yield {"template": template, "plain": plain}


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory: pytest.TempPathFactory, rerankers: dict[str, Path]) -> Iterator[Engine]:
    """hydrad started with llama-server's command line on the reranker without a template."""
    tmp = tmp_path_factory.mktemp("plain")
    port = free_port()
    e = Engine(tmp, name="plain", port=port, flags=["-m", str(rerankers["plain"]), "--reranking", "-c", "512",
                                                     "-np", "1", "-t", "1", "-ub", str(N_UBATCH), "-b", str(N_UBATCH),
                                                     "--host", "127.0.0.1", "--port", str(port)])
    e.wait_ready(120)
    yield e
    e.stop()


def rerank(http: httpx.Client, path: str = "/rerank", **body: Any) -> Any:
    r = http.post(path, json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_scores_are_per_document_sorted_and_cut_at_top_n(pool: Pool) -> None:
    alone = {}
    for i, doc in enumerate(DOCS):
        (only,) = rerank(pool.rr.http, documents=[doc])["results"]
        assert only["index"] == 0
        alone[i] = only["relevance_score"]
    assert len(set(alone.values())) == len(DOCS), alone  # random weights still tell the documents apart
    for door, http in (("engine", pool.rr.http), ("coordinator", pool.coordinator.http)):
        for path in ("/rerank", "/v1/rerank", "/reranking", "/v1/reranking"):
            out = rerank(http, path, model="tiny-reranker")
            assert set(out) == {"model", "object", "usage", "results"} and out["object"] == "list", (door, out)
            assert out["model"] == "tiny-reranker"
            results = out["results"]
            assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
            assert all(set(r) == {"index", "relevance_score"} for r in results)
            scores = [r["relevance_score"] for r in results]
            assert scores == sorted(scores, reverse=True), (door, path, scores)
            for r in results:  # (batched with the others: other matmul shapes, other rounding)
                assert r["relevance_score"] == pytest.approx(alone[r["index"]], abs=1e-3), (door, r)
            assert out["usage"]["prompt_tokens"] == out["usage"]["total_tokens"] > len(DOCS)
        top = rerank(http, top_n=2, model="tiny-reranker")["results"]
        assert top == results[:2]
        assert rerank(http, top_n=0, model="tiny-reranker")["results"] == []


def _same(ours: Any, theirs: Any, label: str) -> None:
    assert [r["index"] for r in ours] == [r["index"] for r in theirs]
    assert [set(r) for r in ours] == [set(r) for r in theirs]
    assert [r[label] for r in ours] == pytest.approx([r[label] for r in theirs], abs=1e-3)
    assert [r.get("text") for r in ours] == [r.get("text") for r in theirs]


def test_answers_are_llama_servers(pool: Pool, plain_engine: Engine, llama_servers: dict[str, httpx.Client]) -> None:
    for which, doors in (("template", [pool.rr.http, pool.coordinator.http]), ("plain", [plain_engine.http])):
        theirs = rerank(llama_servers[which], top_n=4)
        tei = llama_servers[which].post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
        tei_bare = llama_servers[which].post("/rerank", json={"query": QUERY, "texts": DOCS[:3]}).json()
        for http in doors:
            body: dict[str, Any] = {"model": "tiny-reranker"} if http is pool.coordinator.http else {}
            ours = rerank(http, top_n=4, **body)
            assert set(ours) == set(theirs) and ours["object"] == theirs["object"]
            assert ours["usage"] == theirs["usage"], which
            _same(ours["results"], theirs["results"], "relevance_score")
            r = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True, **body})
            assert r.status_code == 200, r.text
            assert isinstance(r.json(), list) and isinstance(tei, list)
            _same(r.json(), tei, "score")
            bare = http.post("/rerank", json={"query": QUERY, "texts": DOCS[:3], **body}).json()
            _same(bare, tei_bare, "score")
            assert all("text" not in x for x in bare)


def test_a_model_that_is_no_reranker_is_refused_with_the_way_to_serve_one(pool: Pool, tmp_path: Path) -> None:
    for http, body in ((pool.lm.http, {}), (pool.coordinator.http, {"model": "smollm2-135m"})):
        r = http.post("/rerank", json={"query": QUERY, "documents": DOCS, **body})
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["code"] == "reranking_disabled" and "--reranking" in err["message"], err
    # asked to rank with a model that declares no rank pooling: its load fails, saying why
    e = Engine(tmp_path, name="no-head", defaults={"model": "smollm2-135m", "n_ctx": 512, "n_parallel": 1,
                                                     "n_threads": 1, "embeddings": True, "pooling": "rank"})
    try:
        def failed() -> dict[str, Any]:
            e.assert_running()
            return e.http.get("/health").json()

        health = eventually(failed, 60, "the load to fail", until=lambda h: bool(h.get("last_error")),
                            ignore=(httpx.TransportError,), context=e.log)
        assert "rank needs a reranker" in health["last_error"], health
    finally:
        e.stop()


@pytest.mark.parametrize("body, field", [
    ({"documents": DOCS}, "query"), ({"query": 3, "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"), ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": ["a", 2]}, "documents"), ({"query": QUERY, "documents": "a"}, "documents"),
    ({"query": QUERY, "documents": DOCS, "texts": DOCS}, "texts"),
    ({"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"), ({"query": QUERY, "documents": DOCS, "top_n": 1.5}, "top_n"),
    ({"query": QUERY, "texts": DOCS, "return_text": "yes"}, "return_text"),
    ({"query": QUERY, "documents": DOCS, "return_documents": True}, "return_documents"),
    ({"query": QUERY, "documents": ["x"] * 2049}, "documents"),
    ({"query": "q" * 3000, "documents": ["x"] * 2000}, "documents"),
])
def test_bad_fields_are_named(pool: Pool, body: dict[str, Any], field: str) -> None:
    for http in (pool.rr.http, pool.coordinator.http):
        r = http.post("/rerank", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_a_prompt_longer_than_the_embedding_context_is_refused_naming_it(pool: Pool) -> None:
    long = " ".join(["panda"] * (N_UBATCH + 10))
    for http in (pool.rr.http, pool.coordinator.http):
        r = http.post("/rerank", json={"query": QUERY, "texts": ["short", long], "model": "tiny-reranker"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "texts" and "texts[1]" in err["message"] and err["n_ubatch"] == N_UBATCH, err
    assert rerank(pool.rr.http)["results"]  # and it serves on


def test_the_embeddings_endpoints_of_a_reranker_refuse_by_name(pool: Pool) -> None:
    for path, body in (("/v1/embeddings", {"input": "hi"}), ("/embedding", {"content": "hi"})):
        r = pool.rr.http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "pooling_rank", r.text

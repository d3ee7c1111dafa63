"""llama-server's ``post_sampling_probs`` and ``timings_per_token`` on a real SmolLM2 engine and through the
coordinator's front door, against llama.cpp's own llama-server on the same model.

Checked: with ``post_sampling_probs`` each token's entry is ``{id, token, bytes, prob, top_probs}`` as
llama-server's, its numbers the probabilities the sampler chain left (top-k, top-p, min-p, temperature):
a greedy request's token has probability 1 and is its only alternative, top-k 1 leaves one alternative of
probability 1, top-k 3 at most three summing to 1; a seeded sampled request draws the same tokens with the
same probabilities as llama-server (within float rounding), and llama-server's greedy answer exactly;
chat's ``logprobs.content`` takes the same shape, streamed and whole, at both doors; /v1/completions
refuses the field by name. With ``timings_per_token`` every streamed piece carries the timings so far
(llama-server's ``tokens_predicted``, ``tokens_evaluated`` and ``timings`` on /completion), counting up
to the end's; without it only the end carries them."""

from __future__ import annotations

import math
from typing import Any, Iterator

import httpx
import pytest

from tests.support import llamaserver
from tests.support.engine import SMOLLM, models_dir
from tests.support.solopool import SoloPool, module_pool, post, streamed

pytestmark = pytest.mark.model

N_CTX = 1024
PROMPT = "The capital of France is"
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 5}
ENTRY = {"id", "token", "bytes", "prob", "top_probs"}
ALT = {"id", "token", "bytes", "prob"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoloPool]:
    yield from module_pool(tmp_path_factory, "post", defaults={"n_ctx": N_CTX, "cache_prompt": False})


@pytest.fixture(scope="module")
def llama_server() -> Iterator[httpx.Client]:
    with llamaserver.running(models_dir() / SMOLLM, *llamaserver.start_args(n_ctx=N_CTX)) as client:
        yield client


def probs_of(http: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    out = post(http, "/completion", {"prompt": PROMPT, "post_sampling_probs": True, **body})
    return out["completion_probabilities"]


def check_entry(e: dict[str, Any], top: int) -> None:
    """One token in llama-server's post-sampling shape: probabilities, sorted, none zero, at most 1 in all."""
    assert set(e) == ENTRY, e
    assert all(set(a) == ALT for a in e["top_probs"]), e
    values = [a["prob"] for a in e["top_probs"]]
    assert 0 < len(values) <= top and all(0 < v <= 1 for v in values), e
    assert values == sorted(values, reverse=True) and sum(values) <= 1 + 1e-5, values
    assert 0 <= e["prob"] <= 1
    for a in e["top_probs"]:
        if a["id"] == e["id"]:
            assert a["prob"] == e["prob"]


def same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], tol: float) -> None:
    assert [e["id"] for e in ours] == [e["id"] for e in theirs]
    for x, y in zip(ours, theirs):
        assert set(x) == set(y) == ENTRY and x["token"] == y["token"] and x["bytes"] == y["bytes"], (x, y)
        assert x["prob"] == pytest.approx(y["prob"], abs=tol), (x, y)
        assert [a["id"] for a in x["top_probs"]] == [a["id"] for a in y["top_probs"]], (x, y)
        assert [set(a) for a in x["top_probs"]] == [set(a) for a in y["top_probs"]]
        assert [a["prob"] for a in x["top_probs"]] == pytest.approx([a["prob"] for a in y["top_probs"]], abs=tol)


def test_completion_probabilities_match_llama_servers(pool: SoloPool, llama_server: httpx.Client) -> None:
    for body, tol in (({"temperature": 0}, 0.0), (SAMPLED, 1e-4)):
        body = {**body, "n_predict": 4, "n_probs": 3, "ignore_eos": True}
        theirs = probs_of(llama_server, **body)
        assert len(theirs) == 4
        for door, http in pool.doors.items():
            ours = probs_of(http, **body)
            same(ours, theirs, tol)
            for e in ours:
                check_entry(e, 3)
            if body["temperature"] == 0:
                assert all(e["prob"] == 1.0 and len(e["top_probs"]) == 1 for e in ours), (door, ours)


def test_probabilities_are_those_the_chain_leaves(pool: SoloPool) -> None:
    base = {"n_predict": 6, "n_probs": 10, "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "min_p": 0.0,
            "seed": 11}
    for http in pool.doors.values():
        one = probs_of(http, **base, top_k=1)
        assert all(e["prob"] == 1.0 and [a["id"] for a in e["top_probs"]] == [e["id"]] for e in one), one
        three = probs_of(http, **base, top_k=3)
        for e in three:
            check_entry(e, 3)
            assert sum(a["prob"] for a in e["top_probs"]) == pytest.approx(1.0, abs=1e-5)
            assert e["id"] in [a["id"] for a in e["top_probs"]]
        # before the chain, the same tokens are less likely: the other 49,149 tokens share the rest
        raw = post(http, "/completion", {"prompt": PROMPT, **base, "top_k": 3})["completion_probabilities"]
        assert [e["id"] for e in raw] == [e["id"] for e in three]
        assert all(set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"} for e in raw)
        assert all(math.exp(r["logprob"]) < p["prob"] for r, p in zip(raw, three)), (raw, three)
        # a grammar's request too: its tokens drawn from what the chain left, the grammar obeyed
        g = post(http, "/completion", {"prompt": PROMPT, **base, "top_k": 40, "post_sampling_probs": True,
                                       "grammar": 'root ::= " Paris" | " Lyon" | " Nice"'})
        assert g["content"] in (" Paris", " Lyon", " Nice")
        for e in g["completion_probabilities"]:
            check_entry(e, 10)


def test_chat_logprobs_take_the_post_sampling_shape_streamed_and_whole(pool: SoloPool) -> None:
    body = {"messages": ASK, "max_tokens": 5, "ignore_eos": True, "logprobs": True, "top_logprobs": 4,
            "post_sampling_probs": True, **SAMPLED}
    wholes = []
    for door, http in pool.doors.items():
        out = post(http, "/v1/chat/completions", body)
        entries = out["choices"][0]["logprobs"]["content"]
        assert len(entries) == 5, door
        for e in entries:
            check_entry(e, 4)
        assert b"".join(bytes(e["bytes"]) for e in entries) == out["choices"][0]["message"]["content"].encode()
        chunks = streamed(http, "/v1/chat/completions", body)
        pieces = [e for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
                  for e in c["choices"][0]["logprobs"]["content"]]
        assert [e["id"] for e in pieces] == [e["id"] for e in entries]
        assert [e["prob"] for e in pieces] == pytest.approx([e["prob"] for e in entries], abs=1e-5)
        wholes.append(entries)
    assert [e["id"] for e in wholes[0]] == [e["id"] for e in wholes[1]]


def test_legacy_completions_refuse_it_by_name(pool: SoloPool) -> None:
    for http in pool.doors.values():
        r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "logprobs": 2,
                                               "post_sampling_probs": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "post_sampling_probs", r.text
        r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "post_sampling_probs": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "post_sampling_probs", r.text


def _content_chunks(path: str, chunks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the pieces that carry text, the last chunk)."""
    if path == "/completion":
        return [c for c in chunks if not c["stop"] and c["content"]], chunks[-1]
    return [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")], \
        next(c for c in reversed(chunks) if c["choices"])


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions"])
def test_timings_per_token_put_the_timings_so_far_in_every_piece(path: str, pool: SoloPool,
                                                                 llama_server: httpx.Client) -> None:
    body: dict[str, Any] = {"n_predict": 6, "ignore_eos": True, "temperature": 0}
    body.update({"prompt": PROMPT} if path == "/completion" else {"messages": ASK})
    theirs, _ = _content_chunks(path, streamed(llama_server, path, {**body, "timings_per_token": True}))
    for door, http in pool.doors.items():
        pieces, last = _content_chunks(path, streamed(http, path, {**body, "timings_per_token": True}))
        assert pieces and all("timings" in c for c in pieces), (door, pieces)
        if path == "/completion":  # llama-server's fields of a piece, with the counts so far
            assert all(set(c) >= {"index", "content", "tokens", "stop", "tokens_predicted", "tokens_evaluated",
                                  "timings"} for c in pieces)
            assert {k for c in theirs for k in c} - {"id_slot"} <= {k for c in pieces for k in c}
        predicted = [c["timings"]["predicted_n"] for c in pieces]
        assert predicted == sorted(predicted) and predicted[0] >= 1 and predicted[-1] <= 6, predicted
        assert all(c["timings"]["prompt_n"] == last["timings"]["prompt_n"] for c in pieces)
        assert pieces[-1]["timings"]["predicted_ms"] <= last["timings"]["predicted_ms"]
        assert last["timings"]["predicted_n"] == 6
        plain, last = _content_chunks(path, streamed(http, path, body))
        assert plain and not any("timings" in c for c in plain) and "timings" in last, door

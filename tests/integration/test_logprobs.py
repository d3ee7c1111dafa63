"""Log-probabilities on real engines (SmolLM2, 49,152-token vocabulary; Gemma-3, 262,144) and through
the coordinator's front door: OpenAI chat (``logprobs``/``top_logprobs``), legacy completions (integer
``logprobs``) and llama-server's ``/completion`` (``n_probs``), whole and streamed.

Checked: the shapes; each value a log-probability (at most 0), alternatives sorted, the greedy token
equal to the most likely; the probabilities of the alternatives summing to at most 1 and, with many
on a peaked distribution, to nearly 1; the values equal to a log-softmax over the full vocabulary
computed in this process with llama.cpp on the same tokens; the three endpoints, both doors and
streamed and whole answers agreeing; hostile values refused by name with the engine still serving;
and a prompt longer than the context refused with llama-server's ``n_prompt_tokens`` and ``n_ctx``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from hydrad.common.params import RuntimeParams
from tests.support.coordinator import Coordinator
from tests.support.solopool import post, streamed
from tests.support.engine import GEMMA, SMOLLM, Engine, models_dir

pytestmark = pytest.mark.model

MODELS = {"smollm": ("smollm2-135m", SMOLLM), "gemma": ("gemma3-270m", GEMMA)}
N_CTX = 1024
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"
TOP = 5
TOL = 2e-3  # engine (float32 sum) against the float64 reference, and run against run


class Pool:
    """One engine serving a model, and a coordinator whose front door routes to it."""

    def __init__(self, tmp: Path, alias: str) -> None:
        profiles = {"profiles": {"one": {"description": "one engine", "engines": {"solo": {"model": alias}}}},
                    "default": "one"}
        self.coordinator = Coordinator(tmp, profiles=profiles, heartbeat_interval_s=0.5)
        self.coordinator.wait_ready()
        self.engine = Engine(tmp, name="solo", defaults={"n_ctx": N_CTX, "n_parallel": 2, "n_threads": 2,
                                                          "temperature": 0, "cache_prompt": False},
                             extra={"bus": self.coordinator.engine_bus(heartbeat_interval_s=0.5)})
        self.coordinator.wait_serving({"solo": alias}, timeout=180)
        self.doors = {"engine": self.engine.http, "coordinator": self.coordinator.http}

    def stop(self) -> None:
        self.engine.stop()
        self.coordinator.stop()


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pool]]:
    """Pools started on first use, one per model, shared by this module's tests."""
    started: dict[str, Pool] = {}

    class Lazy(dict[str, Pool]):
        def __missing__(self, which: str) -> Pool:
            alias, file = MODELS[which]
            if not (models_dir() / file).is_file():
                pytest.skip(f"model file {file} is missing (scripts/setup fetches it)")
            started[which] = self[which] = Pool(tmp_path_factory.mktemp(which), alias)
            return started[which]

    yield Lazy()
    for pool in started.values():
        pool.stop()


def check_entry(e: dict[str, Any], top: int, greedy: bool) -> None:
    """One token of the chat / native shape."""
    assert set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"}, e
    assert isinstance(e["token"], str) and all(0 <= b < 256 for b in e["bytes"]) and e["logprob"] <= 0
    alts = e["top_logprobs"]
    assert len(alts) == top, e
    assert all(set(a) == {"id", "token", "bytes", "logprob"} and a["logprob"] <= 0 for a in alts)
    values = [a["logprob"] for a in alts]
    assert values == sorted(values, reverse=True), values
    assert sum(math.exp(v) for v in values) <= 1 + 1e-6
    if greedy and alts:
        assert e["id"] == alts[0]["id"] and e["logprob"] == alts[0]["logprob"], e
    if any(a["id"] == e["id"] for a in alts):
        assert next(a["logprob"] for a in alts if a["id"] == e["id"]) == e["logprob"]


def close(a: list[dict[str, Any]], b: list[dict[str, Any]], tol: float = TOL) -> None:
    """Two lists of chat / native entries: the same tokens, log-probabilities within ``tol``."""
    assert [e["id"] for e in a] == [e["id"] for e in b]
    for x, y in zip(a, b):
        assert x["bytes"] == y["bytes"] and abs(x["logprob"] - y["logprob"]) <= tol, (x, y)
        assert [t["logprob"] for t in x["top_logprobs"]] == pytest.approx([t["logprob"] for t in y["top_logprobs"]],
                                                                          abs=tol)


def chat_entries(http: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = post(http, "/v1/chat/completions", body)
    return out, out["choices"][0]["logprobs"]["content"]


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_shapes_on_both_doors(which: str, pools: dict[str, Pool]) -> None:
    pool = pools[which]
    for door, http in pool.doors.items():
        body = {"messages": ASK, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": True,
                "top_logprobs": TOP}
        out, entries = chat_entries(http, body)
        assert len(entries) == out["usage"]["completion_tokens"] == 10, door
        for e in entries:
            check_entry(e, TOP, greedy=True)
        assert b"".join(bytes(e["bytes"]) for e in entries) == out["choices"][0]["message"]["content"].encode()

        legacy = post(http, "/v1/completions", {"prompt": COUNT, "max_tokens": 6, "temperature": 0,
                                                "ignore_eos": True, "logprobs": 3})
        lp = legacy["choices"][0]["logprobs"]
        text = legacy["choices"][0]["text"]
        assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
        assert all(text[o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"])), lp
        for chosen, token, top in zip(lp["token_logprobs"], lp["tokens"], lp["top_logprobs"]):
            assert len(top) in (3, 4) and top[token] == chosen == max(top.values()) and chosen <= 0

        plain = post(http, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2})
        assert plain["choices"][0]["logprobs"] is None
        only = chat_entries(http, {"messages": ASK, "max_tokens": 3, "logprobs": True})[1]
        assert len(only) == 3 and all(e["top_logprobs"] == [] for e in only)
        none = chat_entries(http, {"messages": ASK, "max_tokens": 0, "logprobs": True})[1]
        assert none == []

        # the raw distribution, before a grammar: the chosen token need not be the most likely
        yes_no = chat_entries(http, {**body, "grammar": 'root ::= "yes" | "no"', "ignore_eos": False})[1]
        assert yes_no and all(e["logprob"] <= e["top_logprobs"][0]["logprob"] for e in yes_no)
        for e in yes_no:
            check_entry(e, TOP, greedy=False)

    native = post(pool.engine.http, "/completion", {"prompt": COUNT, "n_predict": 6, "temperature": 0,
                                                    "ignore_eos": True, "n_probs": TOP})
    probs = native["completion_probabilities"]
    assert len(probs) == native["tokens_predicted"] == 6 and native["generation_settings"]["n_probs"] == TOP
    for e in probs:
        check_entry(e, TOP, greedy=True)
    assert "completion_probabilities" not in post(pool.engine.http, "/completion", {"prompt": COUNT, "n_predict": 2})


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_probabilities_of_many_alternatives_sum_to_nearly_one_when_peaked(which: str, pools: dict[str, Pool]) -> None:
    http = pools[which].engine.http
    out = post(http, "/completion", {"prompt": COUNT, "n_predict": 3, "temperature": 0, "n_probs": 100})
    for e in out["completion_probabilities"]:
        check_entry(e, 100, greedy=True)
        mass = sum(math.exp(a["logprob"]) for a in e["top_logprobs"])
        assert 0.9 <= mass <= 1 + 1e-6, (e["token"], mass)


def reference(path: Path, prompt: list[int], generated: list[int], top: int) -> list[tuple[float, list[float]]]:
    """(log-probability of each generated token, the ``top`` largest log-probabilities) from a log-softmax
    in float64 over the full vocabulary, computed here with llama.cpp on the same tokens."""
    import numpy as np

    from hydrad.engine import llama
    from hydrad.engine.batch import Batch

    llama.preload_native()
    params = RuntimeParams(n_gpu_layers=0, n_ctx=N_CTX, n_parallel=1, n_threads=2)
    model = llama.Model.load(path, params)
    ctx = llama.Context(model, params)
    batch = Batch(N_CTX)
    out: list[tuple[float, list[float]]] = []
    try:
        batch.clear()
        idx = batch.add_run(prompt, 0, 0, True)
        for i, token in enumerate(generated):
            assert batch.decode(ctx) == 0
            ptr = llama.lib().llama_get_logits_ith(ctx.ptr, idx)
            row = np.ctypeslib.as_array(ptr, shape=(model.n_vocab,)).astype(np.float64)
            logp = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            out.append((float(logp[token]), sorted(logp.tolist(), reverse=True)[:top]))
            batch.clear()
            idx = batch.add(token, len(prompt) + i, 0, True)
    finally:
        batch.free()
        ctx.free()
        model.free()
    return out


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_values_match_a_log_softmax_over_the_full_vocabulary(which: str, pools: dict[str, Pool]) -> None:
    """Sampled (temperature 0.8, seeded) so the chosen token is not always the most likely one."""
    http = pools[which].engine.http
    prompt = post(http, "/tokenize", {"content": "Once upon a time, in a quiet village,", "add_special": True})["tokens"]
    out = post(http, "/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0.8, "seed": 7,
                                     "ignore_eos": True, "n_probs": TOP, "return_tokens": True})
    probs = out["completion_probabilities"]
    assert [e["id"] for e in probs] == out["tokens"] and len(probs) == 12
    want = reference(models_dir() / MODELS[which][1], prompt, out["tokens"], TOP)
    for e, (chosen, top) in zip(probs, want):
        check_entry(e, TOP, greedy=False)
        assert e["logprob"] == pytest.approx(chosen, abs=TOL), e
        assert [a["logprob"] for a in e["top_logprobs"]] == pytest.approx(top, abs=TOL), e


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_endpoints_doors_and_streams_agree(which: str, pools: dict[str, Pool]) -> None:
    pool = pools[which]
    engine = pool.engine.http
    body = {"messages": ASK, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": TOP}
    _, whole = chat_entries(engine, body)
    # the same prompt as text to llama-server's /completion: the same tokens and values
    prompt = post(engine, "/apply-template", {"messages": ASK})["prompt"]
    native = post(engine, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": TOP})
    close(whole, native["completion_probabilities"])
    pieces = streamed(engine, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": TOP})
    assert "completion_probabilities" not in pieces[-1] and pieces[-1]["stop"] is True
    close(whole, [e for p in pieces[:-1] for e in p["completion_probabilities"]])
    for door, http in pool.doors.items():
        chunks = streamed(http, "/v1/chat/completions", body)
        got = [e for c in chunks if c.get("choices") and c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
        close(whole, got)
        assert all(c["choices"][0]["logprobs"] is None for c in chunks
                   if c.get("choices") and not c["choices"][0].get("delta", {}).get("content")), door
        close(whole, chat_entries(http, body)[1])
        legacy_body = {"prompt": COUNT, "max_tokens": 6, "temperature": 0, "logprobs": 2}
        legacy = post(http, "/v1/completions", legacy_body)["choices"][0]["logprobs"]
        parts = [c["choices"][0]["logprobs"] for c in streamed(http, "/v1/completions", legacy_body)
                 if c.get("choices") and c["choices"][0]["logprobs"]]
        joined = {k: [v for p in parts for v in p[k]] for k in legacy}
        assert joined["tokens"] == legacy["tokens"] and joined["text_offset"] == legacy["text_offset"], door
        assert joined["token_logprobs"] == pytest.approx(legacy["token_logprobs"], abs=TOL)
        # a stop string: the tokens of the text that was sent, the same whole and streamed
        cut_body = {**legacy_body, "max_tokens": 12, "stop": ["1"]}
        cut = post(http, "/v1/completions", cut_body)["choices"][0]
        assert cut["finish_reason"] == "stop" and cut["text"] and "1" not in cut["text"], cut
        assert "".join(cut["logprobs"]["tokens"]).startswith(cut["text"]), cut
        parts = [c["choices"][0]["logprobs"] for c in streamed(http, "/v1/completions", cut_body)
                 if c.get("choices") and c["choices"][0]["logprobs"]]
        assert [t for p in parts for t in p["tokens"]] == cut["logprobs"]["tokens"], door


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "x"}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 1e9}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"n_probs": 3}, "n_probs"),
    ("/v1/chat/completions", {"logprobs": True, "post_sampling_probs": "yes"}, "post_sampling_probs"),
    ("/v1/completions", {"logprobs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": 1e9}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/completion", {"n_probs": -1}, "n_probs"),
    ("/completion", {"n_probs": 101}, "n_probs"),
    ("/completion", {"n_probs": "x"}, "n_probs"),
    ("/completion", {"n_probs": 1e9}, "n_probs"),
    ("/completion", {"n_probs": 2, "post_sampling_probs": 1}, "post_sampling_probs"),
    ("/completion", {"logprobs": True}, "logprobs"),
]


def test_hostile_values_are_refused_by_name_and_the_engine_serves_on(pools: dict[str, Pool]) -> None:
    pool = pools["smollm"]
    for door, http in pool.doors.items():
        for path, fields, field in HOSTILE:
            base: dict[str, Any] = {"messages": ASK} if path.endswith("chat/completions") else {"prompt": "Hi"}
            r = http.post(path, json={**base, "max_tokens": 2, **fields})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (door, path, fields, r.text)
    assert pool.engine.http.get("/livez").status_code == 200
    for http in pool.doors.values():
        assert chat_entries(http, {"messages": ASK, "max_tokens": 2, "logprobs": True, "top_logprobs": 20})[1]


def _overflow(r: httpx.Response, tokens: int | None) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["n_ctx"] == N_CTX, err
    if tokens is None:  # refused by its length before tokenizing: a lower bound
        assert err["n_prompt_tokens"] > N_CTX, err
    else:
        assert err["n_prompt_tokens"] == tokens, err


LONG = " ".join(["word"] * 1500)
HUGE = "x" * (64 * N_CTX + 1)  # more characters than the context could hold: refused without tokenizing


def _tokens(http: httpx.Client, text: str) -> int:
    return len(post(http, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"])


def test_context_overflow_names_the_sizes_on_the_engine(pools: dict[str, Pool]) -> None:
    http = pools["smollm"].engine.http
    tokens = _tokens(http, LONG)
    chat = [{"role": "user", "content": LONG}]
    assert tokens > N_CTX
    _overflow(http.post("/v1/completions", json={"prompt": LONG, "max_tokens": 2}), tokens)
    _overflow(http.post("/completion", json={"prompt": LONG, "n_predict": 2}), tokens)
    _overflow(http.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 2}),
              _tokens(http, post(http, "/apply-template", {"messages": chat})["prompt"]))
    _overflow(http.post("/v1/completions", json={"prompt": HUGE, "max_tokens": 2}), None)
    _overflow(http.post("/completion", json={"prompt": HUGE, "n_predict": 2, "stream": True}), None)
    assert post(http, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})["choices"]


def test_context_overflow_names_the_sizes_at_the_front_door_on_completion(pools: dict[str, Pool]) -> None:
    """llama-server's /completion is forwarded over HTTP: the engine's answer as it is."""
    pool = pools["smollm"]
    http = pool.coordinator.http
    _overflow(http.post("/completion", json={"prompt": LONG, "n_predict": 2}), _tokens(pool.engine.http, LONG))
    _overflow(http.post("/completion", json={"prompt": HUGE, "n_predict": 2}), None)


def test_context_overflow_names_the_sizes_at_the_front_door(pools: dict[str, Pool]) -> None:
    pool = pools["smollm"]
    http = pool.coordinator.http
    _overflow(http.post("/v1/completions", json={"prompt": LONG, "max_tokens": 2}), _tokens(pool.engine.http, LONG))
    _overflow(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": HUGE}],
                                                     "max_tokens": 2}), None)

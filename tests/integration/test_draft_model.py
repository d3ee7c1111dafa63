"""Speculative decoding with a draft model on real engines: SmolLM2-135M drafting for itself (the same
vocabulary, so most drafts are accepted) gives, token for token, the answer without speculation at the
engine's door and through the front door, with its drafted and accepted counts in the timings, /slots
and /metrics; a seeded sampled answer is unchanged; a draft model of another vocabulary (Gemma-3) is
refused at load naming both files, and the serving model goes on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.conftest import start_solo_pool
from tests.integration.test_speculative import BASE, chat_copy_saves_steps, completion, copy, native_ids
from tests.support.engine import Engine, metric

pytestmark = pytest.mark.model


def drafting(path: Path, **kw: Any) -> dict[str, Any]:
    return {"spec_type": "draft", "spec_draft_model": str(path), "spec_n_max": 6, **kw}


@pytest.fixture
def pair(smollm_path: Path, start_engine: Callable[..., Engine]) -> tuple[Engine, Engine]:
    """Two engines of SmolLM2, one drafting with a second copy of it (its own context, 2048 tokens)."""
    plain = start_engine(name="plain", defaults=BASE)
    spec = start_engine(name="spec", defaults={**BASE, **drafting(smollm_path, n_ctx_draft=2048)})
    plain.wait_ready(120)
    spec.wait_ready(120)
    return plain, spec


def test_greedy_answer_is_the_plain_one_with_a_draft_model(pair: tuple[Engine, Engine]) -> None:
    plain, spec = pair
    params = spec.http.get("/control/config").json()["params"]
    assert params["spec_draft_n_ctx"]["value"] == 2048 and params["spec_type"]["value"] == "draft"
    want, t_plain = native_ids(plain.http)
    got, t_spec = native_ids(spec.http)
    assert got == want and len(got) == 120
    assert "draft_n" not in t_plain
    # the same model drafting for itself: nearly every draft is what the served model then picks
    assert t_spec["draft_n"] >= t_spec["draft_n_accepted"] > 0.8 * t_spec["draft_n"] > 60, t_spec
    chat_copy_saves_steps(plain, spec, t_spec)
    for n in (1, 5, 6, 7, 33):  # max_tokens inside a draft and at its edges
        assert native_ids(spec.http, n_predict=n)[0] == want[:n]
    # a new prompt after a long one: the draft's sequence drops the old tail and catches up
    other = completion(plain.http, prompt="The capital of France is", n_predict=24)
    assert completion(spec.http, prompt="The capital of France is", n_predict=24)["tokens"] == other["tokens"]


def test_seeded_sampling_and_concurrent_slots(pair: tuple[Engine, Engine]) -> None:
    """A seeded sampled answer draws the same tokens with a draft model; two requests drafting in the same
    steps (their draft positions batched together) both finish with drafts accepted, shown in /slots."""
    plain, spec = pair
    kw = {"temperature": 0.7, "top_k": 40, "seed": 99}
    want, _ = native_ids(plain.http, **kw)
    got, t = native_ids(spec.http, **kw)
    assert got == want and t["draft_n_accepted"] > 0
    got_both: dict[int, dict[str, Any]] = {}
    seen: list[dict[str, Any]] = []

    def run(i: int) -> None:
        with httpx.Client(base_url=spec.url, timeout=120) as http:
            got_both[i] = completion(http)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        seen.extend(s for s in spec.http.get("/slots").json() if s["is_processing"])
    for i in (0, 1):
        assert len(got_both[i]["tokens"]) == 120 and got_both[i]["timings"]["draft_n_accepted"] > 0
        assert got_both[i]["content"][:48] == completion(plain.http)["content"][:48]
    assert any(s.get("draft_n") for s in seen) and all(s["speculative"] for s in seen)


def test_another_vocabulary_is_refused_at_load(smollm_path: Path, gemma_path: Path,
                                               start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults=BASE)
    e.wait_ready(120)
    base = completion(e.http, cache_prompt=False, id_slot=0)["content"]
    r = e.configure(**drafting(gemma_path))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "load_failed" and err["param"] == "spec_draft_model", err
    assert f"{gemma_path.name} cannot draft for {smollm_path.name}" in err["message"], err
    assert "vocabularies differ" in err["message"], err
    assert completion(e.http, cache_prompt=False, id_slot=0)["content"] == base  # the serving model goes on
    r = e.configure(spec_type="draft")  # no draft model named: refused before anything is loaded
    assert r.status_code == 400 and r.json()["error"]["param"] == "spec_type", r.text
    r = e.configure(**drafting("no-such-draft.gguf"))
    assert r.status_code == 422 and "no such file: no-such-draft.gguf" in r.text, r.text


def test_front_door_with_a_draft_model(tmp_path: Path, smollm_path: Path,
                                       start_engine: Callable[..., Engine]) -> None:
    """One request through the coordinator's front door to an engine drafting with a draft model: the
    answer the same engine gave there without it, the counts in its timings over the bus."""
    c, e = start_solo_pool(tmp_path, start_engine)
    try:
        want = copy(c.http)
        r = e.configure(**drafting(smollm_path))
        assert r.status_code == 200, r.text
        e.wait_ready(120)
        got = copy(c.http)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["timings"]["draft_n"] == metric(e, "llamacpp:spec_decode_num_draft_tokens_total") > 0
        assert got["timings"]["draft_n_accepted"] == metric(e, "llamacpp:spec_decode_num_accepted_tokens_total") > 0
    finally:
        c.stop()

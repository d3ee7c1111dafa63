"""The parameter contract at a real engine's control door: llama.cpp's spellings of the sampling
defaults take effect on what the engine generates, and a configure naming a refused field is
answered 400 with the field and the reason (hydrad.common.paramcontract)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tests.support.engine import Engine

pytestmark = pytest.mark.model

PROMPT = {"prompt": "One, two, three, one, two, three, one, two,", "max_tokens": 16}


def test_sampling_defaults_by_llama_cpp_names_change_what_is_generated(start_engine: Callable[..., Engine],
                                                                        smollm_path: Path) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "n_ctx": 1024, "n_parallel": 1, "n_threads": 1,
                               "temperature": 0})
    e.wait_ready()

    def text(**payload: object) -> str:
        r = e.configure(**payload)
        assert r.status_code == 200, r.text
        return str(e.http.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"])

    greedy = text()
    sampled = text(temp=1.5, seed=7)
    assert sampled != greedy  # a hot, seeded draw wanders off the greedy path ...
    assert text(top_p=0.0001) == greedy  # ... and the nucleus of one token is the greedy one
    assert text(top_p=1.0, min_p=1.0) == greedy  # as is min-p at the top token's own probability
    assert text(top_p=0.95, min_p=0.05) == sampled  # the seeded draw itself is the same each time
    # the repetition penalty looks back penalty_last_n tokens: none is no penalty at all
    assert text(temp=0, penalty_repeat=1.8, penalty_last_n=0) == greedy
    assert text(penalty_last_n=64) != greedy
    config = e.http.get("/control/config").json()["params"]
    assert config["temperature"]["value"] == 0 and config["repeat_last_n"]["value"] == 64


def test_a_configure_naming_a_refused_field_answers_the_field_and_the_reason(
        start_engine: Callable[..., Engine], smollm_path: Path) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "n_ctx": 1024, "n_threads": 1})
    e.wait_ready()
    for field, words in (("grammar_lazy", "lazy grammars are not served"), ("cb_eval", "C callback"),
                         ("interactive", "terminal"), ("mirostat", "no such sampler"),
                         ("frequency_penalty", "set per request"), ("cont_batching", "always on")):
        r = e.configure(**{field: False if field == "cont_batching" else 1})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field and words in err["message"], r.text
    # a fixed field at the value the engine always uses: accepted, nothing changes
    r = e.configure(cont_batching=True, swa_full=True)
    assert r.status_code == 200 and r.json()["changed"] == [], r.text

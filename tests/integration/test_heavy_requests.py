"""Heavy but legal requests at both doors while a steady stream is served: each gets an answer or a
clear 4xx in time, and the stream never stalls (its preparation runs off the engine thread and
off the event loops; its expansions are bounded before they are made)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from tests.conftest import start_solo_pool
from tests.support.engine import Engine
from tests.support.heavy import Answer, SteadyStream, heavy_bodies, send

STEADY = {"messages": [{"role": "user", "content": "Count from one to a hundred."}], "max_tokens": 48,
          "ignore_eos": True}
EXPECTED = {  # name -> the statuses (and 4xx codes) each may answer
    "min_items_1e8": {(400, "invalid_field")},
    "tools_128": {(200, None), (400, "context_length_exceeded")},  # 17,901 prompt tokens: more than a slot holds
    "messages_40000": {(400, "context_length_exceeded")},
}


def _together(url: str, model: str | None) -> list[Answer]:
    answers: list[Answer] = []
    threads = [threading.Thread(target=lambda n=n, p=p, b=b: answers.append(send(url, n, p, b, timeout=60)))
               for n, (p, b) in heavy_bodies(model).items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return answers


def _check(steady: SteadyStream, answers: list[Answer]) -> None:
    for a in answers:
        assert (a.status, a.code) in EXPECTED[a.name], a
        assert a.seconds < 30, a
    assert not steady.failures, steady.failures
    assert steady.gaps and max(steady.gaps) < 2.0, max(steady.gaps)
    assert max(steady.first_tokens) < 3.0, steady.first_tokens


def test_heavy_requests_at_the_engine_door(smollm_engine: Engine) -> None:
    steady = SteadyStream(smollm_engine.url + "/v1/chat/completions", STEADY)
    t = steady.start()
    try:
        answers = _together(smollm_engine.url, None)
    finally:
        steady.stop()
        t.join(60)
    _check(steady, answers)
    smollm_engine.assert_running()


def test_heavy_requests_at_the_front_door(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    c, e = start_solo_pool(tmp_path, start_engine)
    try:
        steady = SteadyStream(c.url + "/v1/chat/completions", STEADY)
        t = steady.start()
        try:
            answers = _together(c.url, "smollm2-135m")
        finally:
            steady.stop()
            t.join(60)
        _check(steady, answers)
        assert c.engines()["solo"]["alive"]
        assert not c.events.of("engine.down")
    finally:
        c.stop()

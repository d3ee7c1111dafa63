"""Heavy but legal requests at both doors while a steady stream is served: each gets an answer or a
clear 4xx in time, and the stream never stalls (its preparation runs off the engine thread and
off the event loops; its expansions are bounded before they are made)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import start_solo_pool
from tests.support.engine import Engine
from tests.support.heavy import Answer, SteadyStream, encoded, heavy_bodies, send

STEADY = {"messages": [{"role": "user", "content": "Count from one to a hundred."}], "max_tokens": 48,
          "ignore_eos": True}
# CPU-heavy requests beside a stream whose gaps are timed: alone, neither slowing nor slowed by others
pytestmark = pytest.mark.serial
EXPECTED = {  # name -> the statuses (and 4xx codes) each may answer
    "min_items_1e8": {(400, "invalid_field")},
    "tools_128": {(200, None), (400, "context_length_exceeded")},  # 17,901 prompt tokens: more than a slot holds
    "messages_40000": {(400, "context_length_exceeded")},
}


def _together(url: str, model: str | None) -> list[Answer]:
    time.sleep(1.0)  # the steady client streaming before the heavy requests arrive
    answers: list[Answer] = []
    threads = [threading.Thread(target=lambda n=n, p=p, b=b: answers.append(send(url, n, p, b, timeout=60)))
               for n, (p, b) in encoded(heavy_bodies(model)).items()]
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
    steady = SteadyStream(smollm_engine.url + "/v1/chat/completions", STEADY).start()
    try:
        answers = _together(smollm_engine.url, None)
    finally:
        steady.stop()
    _check(steady, answers)
    smollm_engine.assert_running()


def test_heavy_requests_at_the_front_door(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    c, e = start_solo_pool(tmp_path, start_engine)
    try:
        steady = SteadyStream(c.url + "/v1/chat/completions", STEADY).start()
        try:
            answers = _together(c.url, "smollm2-135m")
        finally:
            steady.stop()
        _check(steady, answers)
        assert c.engines()["solo"]["alive"]
        assert not c.events.of("engine.down")
    finally:
        c.stop()


def _rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


TWO = {"profiles": {"two": {"description": "two SmolLM2 engines", "engines": {
    "a": {"model": "smollm2-135m", "params": {"n_parallel": 4}},
    "b": {"model": "smollm2-135m", "params": {"n_parallel": 4}}}}}, "default": "two"}


def test_every_heavy_request_together_against_a_pool_of_two(tmp_path: Path, smollm_path: Path,
                                                              start_engine: Callable[..., Engine]) -> None:
    """The issue's whole list at once through the front door of a pool of two engines serving two
    steady streams: every stream goes on (no gap over 2 s, no first token after 3 s), no engine
    leaves the bus, no daemon grows by 1 GB, and every heavy request is answered or refused with a
    4xx within 30 s."""
    from tests.support.coordinator import Coordinator

    c = Coordinator(tmp_path, profiles=TWO, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        engines = [start_engine(name=n, defaults={"n_ctx": 4096, "n_threads": 1},
                                extra={"bus": c.engine_bus(heartbeat_interval_s=0.5),
                                       "logging": {"slow_loop_ms": 200}}) for n in ("a", "b")]
        c.wait_serving({"a": "smollm2-135m", "b": "smollm2-135m"}, timeout=120)
        pids = [c.proc.pid] + [e.proc.pid for e in engines]
        before = {pid: _rss_kb(pid, "VmRSS") for pid in pids}
        bodies = encoded(heavy_bodies("smollm2-135m", all_kinds=True))
        streams = [SteadyStream(c.url + "/v1/chat/completions", {**STEADY, "model": "smollm2-135m"}).start()
                   for _ in range(2)]
        try:
            time.sleep(1.5)  # both clients streaming before the heavy requests arrive
            answers = []
            workers = [threading.Thread(target=lambda n=n, p=p, b=b: answers.append(send(c.url, n, p, b, timeout=60)))
                       for n, (p, b) in bodies.items()]
            for w in workers:
                w.start()
            for w in workers:
                w.join(90)
        finally:
            for s in streams:
                s.stop()
        expected = {**EXPECTED, "properties_6500": {(400, "invalid_field")}, "tokenize_8mib_pieces": {(200, None)},
                    "token_ids_4m": {(400, "context_length_exceeded")}}
        assert len(answers) == len(bodies)
        for a in answers:
            allowed = expected.get(a.name, {(400, "grammar_too_slow")})  # the growing grammars
            assert (a.status, a.code) in allowed, a
            assert a.seconds < 30, a
        for s in streams:
            assert not s.failures, s.failures
            assert s.gaps and max(s.gaps) < 2.0, max(s.gaps)
            assert max(s.first_tokens) < 3.0, s.first_tokens
        assert not c.events.of("engine.down")
        assert all(e["alive"] for e in c.engines().values())
        for pid in pids:
            grown = _rss_kb(pid, "VmHWM") - before[pid]
            assert grown < 1 << 20, f"process {pid} grew by {grown // 1024} MB"
    finally:
        c.stop()

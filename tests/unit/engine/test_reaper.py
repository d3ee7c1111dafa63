"""The reaper frees what the engine thread hands it on a thread of its own, in order, and survives a failed free."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pytest

from hydrad.engine.reaper import Reaper


class Retired:
    """Stands for a retired generation: the reaper's contract is ``free_parts()`` alone (a context,
    then weights), each part recording which thread freed it and when."""

    def __init__(self, log: list[tuple[str, str]], name: str, fail: bool = False,
                 hold: threading.Event | None = None) -> None:
        self.log, self.name, self.fail, self.hold = log, name, fail, hold
        self.times: dict[str, float] = {}

    def _context(self) -> None:
        if self.hold is not None:
            assert self.hold.wait(10)
        self.times["context"] = time.monotonic()
        if self.fail:
            raise RuntimeError("llama_free failed")

    def _model(self) -> None:
        self.times["model"] = time.monotonic()
        self.log.append((self.name, threading.current_thread().name))

    def free_parts(self) -> list[tuple[str, Callable[[], None]]]:
        return [("context", self._context), ("model", self._model)]


def test_frees_in_order_on_its_own_thread_and_wait_says_when_done(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "hydrad.engine")
    freed: list[tuple[str, str]] = []
    hold = threading.Event()
    reaper = Reaper()
    reaper.bury(Retired(freed, "a", hold=hold), "fp-a", "its last request ended")
    reaper.bury(Retired(freed, "b"), "fp-b", "replaced while idle")
    assert not reaper.wait(0.05)  # the first free is still running: the caller was not held up by it
    hold.set()
    assert reaper.wait(10)
    assert freed == [("a", "hydrad-reaper"), ("b", "hydrad-reaper")]
    assert reaper.freed == 2
    fields = [r.fields for r in caplog.records if r.getMessage() == "generation retired"]  # type: ignore[attr-defined]
    assert [f["generation"] for f in fields] == ["fp-a", "fp-b"]
    assert fields[1]["why"] == "replaced while idle" and all(f["free_ms"] >= 0 for f in fields)


def test_a_failed_free_is_logged_and_the_next_one_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    freed: list[tuple[str, str]] = []
    reaper = Reaper()
    reaper.bury(Retired(freed, "bad", fail=True), "fp-bad", "its last request ended")
    reaper.bury(Retired(freed, "good"), "fp-good", "its last request ended")
    assert reaper.wait(10)
    assert [n for n, _ in freed] == ["good"]  # the failed context free stops that generation's parts
    assert any("freeing a retired generation failed" in r.getMessage() for r in caplog.records)


def test_parts_are_paused_apart_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "hydrad.engine")
    freed: list[tuple[str, str]] = []
    gen = Retired(freed, "a")
    reaper = Reaper(pause_s=0.2)
    reaper.bury(gen, "fp-a", "its last request ended")
    deadline = time.monotonic() + 10
    while reaper.freed == 0 and time.monotonic() < deadline:  # not wait(): that would hurry it
        time.sleep(0.01)
    assert gen.times["model"] - gen.times["context"] >= 0.19
    (fields,) = [r.fields for r in caplog.records if r.getMessage() == "generation retired"]  # type: ignore[attr-defined]
    assert [p.split(":")[0] for p in fields["parts"].split(",")] == ["context", "model"]
    assert fields["free_ms"] < 150  # the pause is not counted as time spent freeing
    first, second = (float(x) for x in fields["starts_ms"].split(","))  # each part's start, after the first's
    assert first == 0.0 and 190 <= second <= (gen.times["model"] - gen.times["context"]) * 1000 + 50


def test_a_delayed_free_waits_and_is_hurried_by_wait(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "hydrad.engine")
    freed: list[tuple[str, str]] = []
    reaper = Reaper(delay_s=0.3)
    t0 = time.monotonic()
    reaper.bury(Retired(freed, "a"), "fp-a", "replaced while idle")
    time.sleep(0.1)
    assert freed == []  # held for the delay
    deadline = time.monotonic() + 10
    while reaper.freed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert time.monotonic() - t0 >= 0.29 and freed == [("a", "hydrad-reaper")]
    (fields,) = [r.fields for r in caplog.records if r.getMessage() == "generation retired"]  # type: ignore[attr-defined]
    assert fields["held_ms"] >= 290

    # a load or shutdown wants the memory: wait() frees at once, delay and pause or not
    slow = Reaper(delay_s=60, pause_s=60)
    slow.bury(Retired(freed, "b"), "fp-b", "replaced while idle")
    t1 = time.monotonic()
    assert slow.wait(10)
    assert time.monotonic() - t1 < 5 and freed[-1] == ("b", "hydrad-reaper")
    slow.bury(Retired(freed, "c"), "fp-c", "replaced while idle")  # the hurry ended with the last free
    time.sleep(0.1)
    assert freed[-1] == ("b", "hydrad-reaper")
    assert slow.wait(10) and freed[-1] == ("c", "hydrad-reaper")


def test_held_bytes_count_until_freed() -> None:
    """What the reaper holds counts as free memory when a load picks its policy: it is freed first."""
    freed: list[tuple[str, str]] = []
    reaper = Reaper(delay_s=60)
    reaper.bury(Retired(freed, "a"), "fp-a", "replaced while idle", nbytes=3 << 30)
    reaper.bury(Retired(freed, "b"), "fp-b", "replaced while idle", nbytes=1 << 30)
    assert reaper.held_bytes == 4 << 30
    assert reaper.wait(10)
    assert reaper.held_bytes == 0 and len(freed) == 2

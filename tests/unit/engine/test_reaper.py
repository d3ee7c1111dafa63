"""The reaper frees what the engine thread hands it on a thread of its own, in order, and survives a failed free."""

from __future__ import annotations

import logging
import threading

import pytest

from hydrad.engine.reaper import Reaper


class Retired:
    """Stands for a retired generation: the reaper's contract is ``free()`` alone."""

    def __init__(self, log: list[tuple[str, str]], name: str, fail: bool = False,
                 hold: threading.Event | None = None) -> None:
        self.log, self.name, self.fail, self.hold = log, name, fail, hold

    def free(self) -> None:
        if self.hold is not None:
            assert self.hold.wait(10)
        self.log.append((self.name, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("llama_free failed")


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
    assert [n for n, _ in freed] == ["bad", "good"]
    assert any("freeing a retired generation failed" in r.getMessage() for r in caplog.records)

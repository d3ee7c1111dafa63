"""The tests' waiting helper: returns the first value that holds, fails naming what and the last value."""
import asyncio
import itertools

import pytest

from tests.support.wait import eventually, eventually_async


def test_returns_the_first_value_that_holds() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter) >= 3 and "yes", 5, "three calls", interval=0) == "yes"


def test_until_tests_the_value_and_returns_it() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter), 5, "a count of 2", until=lambda n: n == 2, interval=0) == 2


def test_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the stage to be ready; last seen: \{'stage': 'loading'\}"):
        eventually(lambda: {"stage": "loading"}, 0.05, "the stage to be ready",
                   until=lambda h: h["stage"] == "ready", interval=0.01)


def test_ignored_exceptions_are_retried_and_reported() -> None:
    calls = itertools.count()

    def probe() -> int:
        if next(calls) < 2:
            raise ConnectionError("not listening")
        return 7

    assert eventually(probe, 5, "a connection", ignore=(ConnectionError,), interval=0) == 7
    with pytest.raises(AssertionError, match="last seen: ConnectionError"):
        eventually(lambda: (_ for _ in ()).throw(ConnectionError("refused")), 0.05, "x", ignore=(ConnectionError,))


def test_other_exceptions_end_the_wait_at_once() -> None:
    def probe() -> None:
        raise AssertionError("the daemon exited")

    with pytest.raises(AssertionError, match="the daemon exited"):
        eventually(probe, 60, "never")


def test_context_is_appended() -> None:
    with pytest.raises(AssertionError, match="log tail here"):
        eventually(lambda: None, 0.01, "x", context=lambda: "log tail here")


def test_the_async_form_lets_the_loop_run() -> None:
    async def main() -> int:
        box: list[int] = []
        asyncio.get_running_loop().call_later(0.02, box.append, 5)
        return await eventually_async(lambda: box[0] if box else 0, 5, "the callback", interval=0.005)

    assert asyncio.run(main()) == 5


def test_the_async_form_times_out_naming_what() -> None:
    with pytest.raises(AssertionError, match="waiting for nothing to happen; last seen: False"):
        asyncio.run(eventually_async(lambda: False, 0.03, "nothing to happen", interval=0.01))

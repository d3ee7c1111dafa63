"""``bench_load_stall --hold-alloc`` (scripts/alloc_hold.py): the serving steps' hold while a load beside
them allocates, measured on a GPU and not taken into the engine.

The turnstile is tested with real threads; the watch with the lines the vendored llama.cpp really writes
while it loads SmolLM2 and Gemma, so the bench's flag keeps finding the allocations. (A CPU build
allocates nothing a GPU step would wait for; the window is found all the same.)"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.engine import gguf_meta, llama
from tests.support.scripts import load_script

alloc_hold = load_script("alloc_hold")
StepHold, AllocationWatch = alloc_hold.StepHold, alloc_hold.AllocationWatch
pytestmark = pytest.mark.serial  # windows and steps of a few milliseconds, timed: alone


class Stepper(threading.Thread):
    """A step loop as the engine thread's: enter, a step of ``step_s``, exit; stamps each step."""

    def __init__(self, hold: StepHold, step_s: float = 0.004) -> None:
        super().__init__(daemon=True)
        self.hold, self.step_s = hold, step_s
        self.steps: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.hold.enter_step()
            t0 = time.monotonic()
            time.sleep(self.step_s)
            t1 = time.monotonic()
            self.hold.exit_step()
            self.steps.append((t0, t1))

    def __enter__(self) -> "Stepper":
        self.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join(2)


def test_no_step_runs_inside_a_held_window() -> None:
    hold = StepHold()
    with Stepper(hold) as stepper:
        windows = []
        for _ in range(5):
            hold.begin()
            t0 = time.monotonic()
            time.sleep(0.006)
            t1 = time.monotonic()
            hold.end()
            windows.append((t0, t1))
            time.sleep(0.01)
    assert hold.holds == 5 and hold.held_s >= 5 * 0.006
    assert stepper.steps, "the step loop never ran"
    for a, b in windows:
        assert not [s for s in stepper.steps if s[0] < b and s[1] > a], "a step overlapped a held window"
    assert hold.steps_waited_s > 0  # steps did wait for the windows


def test_a_window_left_open_holds_the_steps_no_longer_than_the_bound() -> None:
    hold = StepHold(longest_s=0.02)
    with Stepper(hold, step_s=0.001) as stepper:
        hold.begin()
        time.sleep(0.2)  # a window never closed (a line that did not come): the steps go on after the bound
        n = len(stepper.steps)
        hold.end()
    assert n >= 4, f"only {n} steps in 200 ms with a 20 ms bound"


def test_begin_does_not_wait_for_a_step_loop_that_is_idle() -> None:
    hold = StepHold(longest_s=1.0)
    t0 = time.monotonic()
    hold.begin()
    hold.end()
    hold.end()  # a second end is a no-op
    assert time.monotonic() - t0 < 0.1 and hold.holds == 1


def test_the_watch_begins_at_the_last_tensor_and_ends_at_the_first_upload() -> None:
    hold = StepHold()
    watch = AllocationWatch(hold, frozenset({"a.weight", "b.weight", "c.weight"}))
    uploads: list[float] = []
    progress = watch.wrap(lambda v: uploads.append(v) is None)
    watch.line(1, b"create_tensor: loading tensor a.weight\n")
    watch.line(1, b"create_tensor: loading tensor x.bias\n")  # optional, not in the file: ignored
    watch.line(3, b"model has unused tensor b.weight (size = 12 bytes) -- ignoring\n")
    other = threading.Thread(target=watch.line, args=(1, b"create_tensor: loading tensor c.weight\n"))
    other.start()
    other.join()  # another thread's line is not the load's
    assert watch.began is None
    watch.line(1, b"create_tensor: loading tensor c.weight\n")
    assert watch.began is not None and watch.ended is None
    assert progress(0.0) and uploads == [0.0]
    assert watch.ended is not None and hold.holds == 1
    progress(0.5)
    watch.close()
    assert hold.holds == 1 and watch.held_s is not None and watch.held_s >= 0


@pytest.mark.model
@pytest.mark.parametrize("use_mmap", [False, True])
def test_a_real_load_holds_the_steps_only_around_its_allocations(smollm_path: Path, gemma_path: Path,
                                                                  use_mmap: bool) -> None:
    C = llama.lib()
    for path in (smollm_path, gemma_path):
        params = RuntimeParams(n_ctx=256, use_mmap=use_mmap)
        hold = StepHold(longest_s=1.0)  # a bound far above the window: a window that never ends would show
        watch = AllocationWatch(hold, gguf_meta.tensor_names(path))
        uploads: list[float] = []
        feeding = C.llama_log_callback(lambda level, text, _user: watch.line(level, text or b""))
        t0 = time.monotonic()
        C.llama_log_set(feeding, ctypes.c_void_p(0))  # the bench's own callback, as with --hold-alloc
        try:
            with Stepper(hold, step_s=0.002) as stepper:
                try:
                    model = llama.Model.load(path, params, watch.wrap(lambda _v: uploads.append(time.monotonic()) is None))
                finally:
                    watch.close()
                t1 = time.monotonic()
        finally:
            C.llama_log_set(llama._log_cb, ctypes.c_void_p(0))  # the engine's again
        model.free()
        assert hold.holds == 1 and watch.began is not None and watch.ended is not None
        assert t0 < watch.began < uploads[0] and watch.ended <= uploads[0] < t1
        assert watch.held_s is not None and watch.held_s < 0.5 * (t1 - t0), "the hold covered most of the load"
        started = [s for s in stepper.steps if watch.began + 0.001 < s[0] < watch.ended]  # (the one in flight ends)
        assert not started, f"steps started while the load allocated: {started}"
        assert [s for s in stepper.steps if t0 < s[0] < watch.began], "the hold began too early"

"""The serving steps' hold while a load beside them allocates (``alloc_hold``, :mod:`hydrad.engine.stephold`).

The turnstile is tested with real threads; the watch with the lines the vendored llama.cpp really writes
while it loads SmolLM2 and Gemma (so a llama.cpp that words them otherwise fails here, not on a GPU host).
A CPU build allocates nothing a GPU step would wait for, so the engine never holds there: the loads below
stand for a GPU build by passing ``gpu=True``."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.common.registry import ResolvedModel
from hydrad.engine import gguf_meta, llama
from hydrad.engine.generation import allocation_watch, build_generation
from hydrad.engine.gpu import has_local_gpu
from hydrad.engine.stephold import AllocationWatch, StepHold


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


def test_tensor_names_of_the_default_models(smollm_path: Path, gemma_path: Path) -> None:
    smollm = gguf_meta.tensor_names(smollm_path)
    assert len(smollm) == 272 and "token_embd.weight" in smollm and "blk.29.ffn_up.weight" in smollm
    assert len(gguf_meta.tensor_names(gemma_path)) == 236


def _gguf(path: Path, kv: list[tuple[str, int]], tensors: list[str]) -> Path:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IH", 2, value)  # a u16 value
    for name in tensors:
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<IQQIQ", 2, 4, 4, 0, 0)
    path.write_bytes(bytes(out))
    return path


def test_a_part_of_a_split_model_lists_no_tensors(tmp_path: Path) -> None:
    whole = _gguf(tmp_path / "whole.gguf", [("general.alignment", 32)], ["t.weight", "u.weight"])
    assert gguf_meta.tensor_names(whole) == {"t.weight", "u.weight"}
    part = _gguf(tmp_path / "part.gguf", [("split.count", 2)], ["t.weight"])
    assert gguf_meta.tensor_names(part) == frozenset()
    assert allocation_watch(StepHold(), part, RuntimeParams(), gpu=True) is None  # never held


def test_a_watch_only_where_something_is_allocated_on_a_gpu(smollm_path: Path) -> None:
    hold = StepHold()
    assert allocation_watch(None, smollm_path, RuntimeParams(), gpu=True) is None
    assert allocation_watch(hold, smollm_path, RuntimeParams(n_gpu_layers=0), gpu=True) is None
    assert allocation_watch(hold, smollm_path, RuntimeParams(), gpu=False) is None
    assert allocation_watch(hold, smollm_path, RuntimeParams(), gpu=True) is not None


@pytest.mark.model
@pytest.mark.parametrize("use_mmap", [False, True])
def test_a_real_load_holds_the_steps_only_around_its_allocations(smollm_path: Path, gemma_path: Path,
                                                                  use_mmap: bool) -> None:
    for path in (smollm_path, gemma_path):
        params = RuntimeParams(n_ctx=256, use_mmap=use_mmap)
        hold = StepHold(longest_s=1.0)  # a bound far above the window: a window that never ends would show
        watch = allocation_watch(hold, path, params, gpu=True)
        assert watch is not None
        uploads: list[float] = []
        t0 = time.monotonic()
        with Stepper(hold, step_s=0.002) as stepper, llama.lines_to(watch.line):
            try:
                model = llama.Model.load(path, params, watch.wrap(lambda _v: uploads.append(time.monotonic()) is None))
            finally:
                watch.close()
            t1 = time.monotonic()
        model.free()
        assert hold.holds == 1 and watch.began is not None and watch.ended is not None
        assert t0 < watch.began < uploads[0] and watch.ended <= uploads[0] < t1
        assert watch.held_s is not None and watch.held_s < 0.5 * (t1 - t0), "the hold covered most of the load"
        started = [s for s in stepper.steps if watch.began + 0.001 < s[0] < watch.ended]  # (the one in flight ends)
        assert not started, f"steps started while the load allocated: {started}"
        before = [s for s in stepper.steps if t0 < s[0] < watch.began]
        assert before, "the step loop was held before the allocations (the hold began too early)"


@pytest.mark.model
def test_a_cpu_build_never_holds_the_steps(smollm_path: Path) -> None:
    hold = StepHold()
    resolved = ResolvedModel(alias="smollm2-135m", path=smollm_path, entry=None)
    gen = build_generation(resolved, RuntimeParams(n_ctx=256), lambda _v: True, 1, on_warming=lambda: None,
                           beside=True, hold=hold)
    try:
        if has_local_gpu():
            pytest.skip("this llama.cpp is a GPU build: a load there is held (the test above covers the window)")
        assert gen.alloc_hold_seconds is None and hold.holds == 0
    finally:
        gen.free()

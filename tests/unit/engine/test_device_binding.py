"""One engine per GPU: a start-only ``device`` hides the host's other GPUs from llama.cpp.

No GPU exists here; what is tested is what the GPU runtimes read (their visibility variables)
and that the setting is validated and reported."""

from __future__ import annotations

import ctypes
import threading

import pytest
from pydantic import ValidationError

from hydrad.engine.gpu import DEVICE_ENV, PageableGate, bind_devices, set_cuda_switches
from hydrad.engine.settings import EngineSettings


def test_index_binds_every_gpu_runtime() -> None:
    env: dict[str, str] = {}
    bind_devices("1", env)
    assert env == {name: "1" for name in DEVICE_ENV}


def test_uuid_binds_cuda_and_hip_but_not_vulkan() -> None:
    env: dict[str, str] = {}
    bind_devices("GPU-8f7e6d5c-1234-5678-9abc-def012345678", env)
    assert set(env) == {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}


def test_no_device_leaves_the_environment_alone_and_an_operator_override_wins() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3"}
    bind_devices(None, env)
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}
    bind_devices("0", env)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["HIP_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize("bad", ["", "a", "0;rm -rf /", "-1", "0,,1", "GPU-"])
def test_bad_device_names_the_field(bad: str) -> None:
    with pytest.raises(ValidationError) as exc:
        EngineSettings(device=bad)
    assert "device" in str(exc.value)


@pytest.mark.parametrize("good", ["0", "0,1", "12"])
def test_good_devices(good: str) -> None:
    assert EngineSettings(device=good).device == good


@pytest.mark.parametrize("setting,variable", [("cuda_graphs", "GGML_CUDA_DISABLE_GRAPHS"),
                                              ("cuda_pinned_host", "GGML_CUDA_NO_PINNED")])
def test_a_cuda_switch_off_sets_the_variable_ggml_reads_and_on_leaves_it_alone(setting: str, variable: str) -> None:
    env: dict[str, str] = {}
    set_cuda_switches({setting: True}, env)
    assert env == {}
    set_cuda_switches({setting: False}, env)
    assert env == {variable: "1"}
    operator = {variable: ""}  # an operator's own value wins, even an empty one
    set_cuda_switches({setting: False}, operator)
    assert operator == {variable: ""}
    assert getattr(EngineSettings(), setting) is True


def _getenv(name: str) -> bytes | None:
    """What C code (ggml) reads: the process environment itself, not Python's copy of it."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    return libc.getenv(name.encode())


def test_alone_arms_a_gate_whose_window_alone_makes_host_buffers_pageable() -> None:
    gate = PageableGate("GGML_CUDA_NO_PINNED")
    env: dict[str, str] = {}
    set_cuda_switches({"cuda_pinned_host": "alone"}, env, gate)
    assert gate.armed and env == {}
    assert _getenv("GGML_CUDA_NO_PINNED") is None
    with gate.open(True):
        assert _getenv("GGML_CUDA_NO_PINNED") == b"1"
    assert _getenv("GGML_CUDA_NO_PINNED") is None
    with gate.open(False):  # no serving generation beside the load: page-locked as ever
        assert _getenv("GGML_CUDA_NO_PINNED") is None
    with pytest.raises(RuntimeError), gate.open(True):
        raise RuntimeError("a failed context creation")
    assert _getenv("GGML_CUDA_NO_PINNED") is None  # closed however the window ends
    gate._write(False)  # the entry is the process's for good; leave it off


def test_an_unarmed_gate_or_an_operators_variable_leaves_the_environment_alone() -> None:
    gate = PageableGate("GGML_CUDA_NO_PINNED")
    with gate.open(True):
        assert _getenv("GGML_CUDA_NO_PINNED") is None
    set_cuda_switches({"cuda_pinned_host": "alone"}, {"GGML_CUDA_NO_PINNED": "1"}, gate)
    assert not gate.armed
    assert EngineSettings(cuda_pinned_host="alone").cuda_pinned_host == "alone"
    with pytest.raises(ValidationError, match="cuda_pinned_host"):
        EngineSettings(cuda_pinned_host="sometimes")


def test_the_window_flips_one_byte_under_readers_on_other_threads() -> None:
    """ggml reads the variable from any thread: a reader sees the variable set or not, never a torn or
    moved environment (setenv could reallocate the array under it)."""
    gate = PageableGate("GGML_CUDA_NO_PINNED")
    gate.arm()
    seen: set[bytes | None] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(_getenv("GGML_CUDA_NO_PINNED"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(20000):
            with gate.open(True):
                pass
    finally:
        stop.set()
        reader.join()
    assert seen <= {None, b"1"} and None in seen
    assert _getenv("GGML_CUDA_NO_PINNED") is None

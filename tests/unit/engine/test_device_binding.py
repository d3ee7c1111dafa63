"""One engine per GPU: a start-only ``device`` hides the host's other GPUs from llama.cpp.

No GPU exists here; what is tested is what the GPU runtimes read (their visibility variables)
and that the setting is validated and reported."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hydrad.engine.gpu import DEVICE_ENV, bind_devices, set_cuda_switches
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

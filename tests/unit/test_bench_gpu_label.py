"""Benchmarks name the GPU as nvidia-smi does: an H100 run is never written up as an H200 one."""

from __future__ import annotations

from tests.support.scripts import load_script

bench_combine = load_script("bench_combine")


def test_the_combine_section_names_the_gpu_nvidia_smi_reported() -> None:
    h100 = {"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"]}
    assert bench_combine.gpu_name(h100) == "NVIDIA H100 80GB HBM3"
    h200 = {"gpus": ["NVIDIA H200, 143771 MiB, 580.159.03"]}
    assert bench_combine.gpu_name(h200) == "NVIDIA H200"
    assert bench_combine.gpu_name({"gpus": ["NVIDIA H200, 1 MiB, x", "NVIDIA H200, 1 MiB, x"]}) == "NVIDIA H200"
    assert bench_combine.gpu_name({}) == "one"

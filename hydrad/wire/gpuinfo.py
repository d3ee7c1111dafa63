"""The device an engine computes on: part of the bus's REGISTER and heartbeat, and what the engine
reports everywhere else. Its own module so that an engine without a coordinator does not build
every bus message at boot (about 55 ms of a model-less boot on the 2-core machine)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GpuInfo(BaseModel):
    """The device an engine computes on, as ggml reports it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = Field("cpu", max_length=256, description="ggml device name (CUDA0, CPU, ...).")
    description: str = Field("", max_length=512, description="Marketing name (NVIDIA GeForce RTX 5060 Ti, ...).")
    kind: str = Field("cpu", max_length=32, description="cpu | gpu | igpu | accel.")
    arch: str = Field("cpu", max_length=32, description="Compute architecture (sm_90, ...) or 'cpu'.")
    vram_total: int = Field(0, ge=0, description="Bytes of device memory.")
    vram_free: int = Field(0, ge=0, description="Bytes free when measured.")

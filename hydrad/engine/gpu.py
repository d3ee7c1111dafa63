"""What an engine tells the coordinator about its device: name, architecture, memory.

ggml lists devices with their memory but not their compute architecture, which the router
needs for quant support per arch (sm_61 P100 vs sm_120 Blackwell). For CUDA devices we ask
the driver (``libcuda``) for the compute capability through ctypes; anything that fails
leaves the architecture at the device kind, never an exception.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import Any, Iterator, Mapping, MutableMapping

from hydrad.wire.gpuinfo import GpuInfo

log = logging.getLogger("hydrad.bus")

_CU_MAJOR, _CU_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


def _cuda_arch(ordinal: int) -> str | None:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        if cu.cuInit(0) != 0:
            return None
        dev = ctypes.c_int(0)
        if cu.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return None
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if cu.cuDeviceGetAttribute(ctypes.byref(major), _CU_MAJOR, dev) != 0:
            return None
        if cu.cuDeviceGetAttribute(ctypes.byref(minor), _CU_MINOR, dev) != 0:
            return None
        return f"sm_{major.value}{minor.value}"
    except (OSError, AttributeError):
        return None


GPU_KINDS = ("gpu", "igpu")


def local_devices() -> list[Any]:
    """ggml's devices on this host (remote ggml-RPC devices left out); raises when no ggml library loads."""
    from hydrad.engine import ggml

    return [d for d in ggml.devices() if not d.name.upper().startswith("RPC")]


def local_gpu() -> GpuInfo:
    """The device this engine computes on: its first GPU, else the CPU."""
    try:
        devices = local_devices()
    except Exception as exc:  # no ggml library: report a CPU engine rather than fail registration
        log.warning("cannot list ggml devices: %s", exc)
        return GpuInfo()
    gpus = [d for d in devices if d.kind in GPU_KINDS]
    dev = (gpus or [d for d in devices if d.kind == "cpu"] or devices or [None])[0]
    if dev is None:
        return GpuInfo()
    arch = "cpu" if dev.kind == "cpu" else dev.kind
    if dev.name.upper().startswith("CUDA"):
        try:
            arch = _cuda_arch(int(dev.name[4:] or 0)) or arch
        except ValueError:
            pass
    return GpuInfo(name=dev.name[:256], description=dev.description[:512], kind=dev.kind, arch=arch,
                   vram_total=max(0, dev.memory_total), vram_free=max(0, dev.memory_free))


# The variables the CUDA, ROCm and Vulkan runtimes read (the daemon sets them from ``device``).
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES")


def bind_devices(device: str | None, environ: MutableMapping[str, str]) -> None:
    """Make only ``device`` visible to llama.cpp's GPU backends, before any of them initialises
    (``preload_native`` only maps the libraries; the backends enumerate devices on first use).
    The variables are the ones the CUDA, ROCm and Vulkan runtimes read; Vulkan takes indices only.
    An operator's own setting in the environment (a unit drop-in) wins."""
    if device is None:
        return
    for name in DEVICE_ENV:
        if name == "GGML_VK_VISIBLE_DEVICES" and not device[0].isdigit():
            continue
        environ.setdefault(name, device)


# The engine's CUDA switches, each a setting that is on by default, and the variable ggml's CUDA back end
# reads when it is off: GGML_CUDA_DISABLE_GRAPHS when it creates a context, GGML_CUDA_NO_PINNED (no
# page-locked host buffers: llama.cpp puts them in ordinary memory) at each host-buffer allocation.
CUDA_SWITCHES = {"cuda_graphs": "GGML_CUDA_DISABLE_GRAPHS", "cuda_pinned_host": "GGML_CUDA_NO_PINNED"}


def set_cuda_switches(settings: Mapping[str, bool | str], environ: MutableMapping[str, str],
                      gate: "PageableGate | None" = None) -> None:
    """Each switch of :data:`CUDA_SWITCHES` that ``settings`` turns off sets its variable to 1, at start,
    before any thread exists to race a later change; like the device binding, an operator's own
    variable wins. ``cuda_pinned_host: alone`` arms ``gate`` (:data:`PAGEABLE_BESIDE`) instead."""
    for name, variable in CUDA_SWITCHES.items():
        value = settings.get(name, True)
        if value == "alone" and variable not in environ:
            (gate or PAGEABLE_BESIDE).arm()
        elif value is False:
            environ.setdefault(variable, "1")


class PageableGate:
    """``GGML_CUDA_NO_PINNED`` for a while, for the contexts a load creates beside a serving generation.

    Allocating page-locked memory (``cudaMallocHost``) stalls every other context on the GPU for
    about 10 ms on an H200, and a new context allocates some (its logits and CPU compute buffers),
    so an overlap reload holds up one of the old generation's steps. Page-locked buffers make a
    context's small host copies a little faster, which is worth keeping where nothing else runs.

    ggml reads the variable at each host-buffer allocation, from any thread, so it cannot be set and
    unset with ``setenv``: that may move the environment array under a concurrent ``getenv``. Instead
    :meth:`arm` adds, once and at start, an entry of our own whose name is one byte off
    (``putenv`` keeps our buffer as the entry), and :meth:`open` writes that one byte."""

    def __init__(self, variable: str) -> None:
        self._on = variable.encode() + b"=1"
        self._at = len(variable) - 1  # the name's last byte: "_" while the window is shut
        self._entry: ctypes.Array[ctypes.c_char] | None = None  # alive for the life of the process

    @property
    def armed(self) -> bool:
        return self._entry is not None

    def arm(self) -> None:
        if self._entry is None:
            entry = ctypes.create_string_buffer(self._on)
            entry[self._at] = b"_"
            if ctypes.CDLL(None).putenv(entry) != 0:
                raise OSError("putenv failed")
            self._entry = entry

    @contextlib.contextmanager
    def open(self, pageable: bool) -> Iterator[None]:
        """A window in which ggml's host buffers are pageable; a no-op unless armed and ``pageable``.
        One window at a time: only the loader thread opens one."""
        if not pageable or self._entry is None:
            yield
            return
        self._write(True)
        try:
            yield
        finally:
            self._write(False)

    def _write(self, on: bool) -> None:
        assert self._entry is not None
        self._entry[self._at] = self._on[self._at:self._at + 1] if on else b"_"


PAGEABLE_BESIDE = PageableGate(CUDA_SWITCHES["cuda_pinned_host"])


def bound_device(setting: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The GPU binding in force, as the bus (REGISTER) and the merged port (INFO) report it.

    The daemon sets the visibility variables from the ``device`` setting before any backend
    starts, but an operator's own variable (a unit drop-in) wins there, so the environment is
    what the backends really see: report it, else the setting; None when every GPU is visible.
    """
    env = os.environ if environ is None else environ
    for name in DEVICE_ENV:
        value = env.get(name)
        if value is not None and value != "":
            return value[:128]
    return setting

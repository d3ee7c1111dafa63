"""Where a load puts a model's weights, worked out from the GGUF's tensor table before llama.cpp reads it.

Two callers need the answer before the load: the load policy (does the new generation fit beside
the serving one?) and routing (does the model fit this engine's VRAM?). Counting the whole file as
VRAM was wrong for an MoE model whose experts stay in host memory (``n_cpu_moe``, or
``override_tensors`` sending ``ffn_*_exps`` to ``CPU``): those bytes are host memory, and on a big
MoE they are most of the file. So this module applies llama.cpp's own placement rules to the tensor
table:

* the tensor buffer type overrides first, in order, the first whose regex matches anywhere in the
  tensor's name winning (llama.cpp's ``std::regex_search`` over ``tensor_buft_overrides``): the
  entries of ``override_tensors``, then ``n_cpu_moe``'s, built as llama-server builds them
  (:func:`cpu_moe_patterns`);
* the input layer (``token_embd`` and its kin) stays on the CPU (llama.cpp never offloads it);
* of the repeating layers and the output layer, the last ``n_gpu_layers`` go to the GPUs
  (``i_gpu_start = n_layer + 1 - n_gpu_layers``), the rest stay on the CPU;
* a model with tied embeddings (no ``output.weight``) gets a second copy of ``token_embd.weight`` as
  its output, placed with the output layer (llama.cpp's ``TENSOR_DUPLICATED``).

Python's ``re.search`` stands in for ``std::regex_search`` (ECMAScript): the same for the patterns
tensor placement uses (alternations, classes, escapes, anchors).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.engine import gguf_meta
from hydrad.engine.gguf_meta import TensorTable

# llama.cpp's expert FFN tensors (common.h's LLM_FFN_EXPS_REGEX): split up/down/gate experts, fused
# gate_up experts, and the "chexps" spelling of some architectures
EXPERT_FFN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU = "CPU"

_LAYER = re.compile(r"^blk\.(\d+)\.")
_INPUT = ("token_embd.", "token_embd_norm.", "token_types.", "per_layer_token_embd.")


def cpu_moe_patterns(n: int, n_layer: int | None = None) -> list[str]:
    """llama-server's ``--n-cpu-moe N``: one override per layer ``i < N``, ``blk\\.<i>`` followed by the
    expert regex, each to the CPU buffer type (common.h's ``llm_ffn_exps_block_regex``). With the model's
    layer count known, N is capped at it: a pattern for a layer that does not exist matches nothing, and
    llama.cpp bounds the length of the override list."""
    count = n if n_layer is None or n_layer <= 0 else min(n, n_layer)
    return [f"blk\\.{i}{EXPERT_FFN}" for i in range(count)]


def tensor_overrides(params: RuntimeParams, n_layer: int | None = None) -> list[tuple[str, str]]:
    """(regex, buffer type name) in the order llama.cpp tries them: ``override_tensors``' entries as
    written, then ``n_cpu_moe``'s. Explicit entries come first so that one naming an expert tensor of a
    low layer (say, to a peer) is not shadowed by the blanket rule."""
    out: list[tuple[str, str]] = []
    for item in params.override_tensors or []:
        pattern, _, target = item.rpartition("=")
        out.append((pattern, target.strip()))
    out += [(p, CPU) for p in cpu_moe_patterns(params.n_cpu_moe, n_layer)]
    return out


def _where(target: str) -> str:
    """Which memory a buffer type's name lives in: ``host`` (CPU), ``peer`` (a ggml-RPC device) or ``device``."""
    t = target.upper()
    if t == CPU or t.startswith("CPU_"):
        return "host"
    if t.startswith("RPC"):
        return "peer"
    return "device"


@dataclass
class WeightSplit:
    """Bytes of a model's weights by where a load with given parameters puts them."""

    device: int = 0  # this engine's GPUs
    host: int = 0  # host memory: CPU buffers, mapped or read, page-locked or not
    peer: int = 0  # COMBINE peers' devices
    overridden: dict[str, int] = field(default_factory=dict)  # bytes each override target receives
    overridden_tensors: int = 0

    def add(self, where: str, nbytes: int) -> None:
        setattr(self, where, getattr(self, where) + nbytes)

    def public(self) -> dict[str, Any]:
        return {"device_bytes": self.device, "host_bytes": self.host, "peer_bytes": self.peer,
                "overridden_bytes": dict(self.overridden), "overridden_tensors": self.overridden_tensors}


def offload_layers(params: RuntimeParams, n_layer: int) -> int:
    """The first layer index llama.cpp puts on a GPU (``i_gpu_start``); ``n_layer`` is the output layer."""
    ngl = n_layer + 1 if params.n_gpu_layers < 0 else params.n_gpu_layers
    return max(n_layer + 1 - ngl, 0)


def gpu_count(params: RuntimeParams, local_gpus: int) -> int:
    """How many GPUs the load offloads to: ``devices`` when given (``['none']``: none), else every local one."""
    if params.devices is not None:
        return 0 if [d.lower() for d in params.devices] == ["none"] else len(params.devices)
    return local_gpus


def split(table: TensorTable, params: RuntimeParams, local_gpus: int) -> WeightSplit:
    """Where each tensor of ``table`` goes under ``params`` on an engine with ``local_gpus`` GPUs."""
    overrides = [(re.compile(p), t) for p, t in tensor_overrides(params, table.n_layer or None)]
    gpus = gpu_count(params, local_gpus)
    n_layer = table.n_layer
    start = offload_layers(params, n_layer) if n_layer else (0 if params.n_gpu_layers != 0 else 1)
    on_gpu_output = gpus > 0 and (start <= n_layer if n_layer else params.n_gpu_layers != 0)
    out = WeightSplit()

    def place(name: str, nbytes: int, default: str, copy: bool = False) -> None:
        target = next((t for rx, t in overrides if rx.search(name)), None)
        where = _where(target) if target is not None else default
        if copy and where == "host":
            return  # a second CPU tensor of the same data reads the same mapping or buffer: no more memory
        out.add(where, nbytes)
        if target is not None:
            out.overridden[target] = out.overridden.get(target, 0) + nbytes
            out.overridden_tensors += 1

    for name, nbytes in table.sizes.items():
        m = _LAYER.match(name)
        if name.startswith(_INPUT):
            default = "host"
        elif m is not None:
            default = "device" if gpus > 0 and int(m.group(1)) >= start else "host"
        else:
            default = "device" if on_gpu_output else "host"
        place(name, nbytes, default)
    if "output.weight" not in table.sizes and "token_embd.weight" in table.sizes:
        # tied embeddings: llama.cpp makes the output a second tensor of token_embd's data, in the output layer
        place("token_embd.weight", table.sizes["token_embd.weight"], "device" if on_gpu_output else "host", copy=True)
    return out


def placement_split(path: Path, params: RuntimeParams, local_gpus: int) -> WeightSplit:
    """:func:`split` of ``path``'s tensor table, remembered per file and per the parameters that place
    tensors: the load policy asks at each load and routing for every model on disk at each
    registration, and a big MoE's table against its per-layer patterns takes tens of milliseconds."""
    st = path.stat()
    key = (tuple(params.override_tensors or ()), params.n_cpu_moe, params.n_gpu_layers,
           tuple(params.devices) if params.devices is not None else None)
    return _placement_split(path, st.st_size, st.st_mtime_ns, key, local_gpus)


@functools.lru_cache(maxsize=256)
def _placement_split(path: Path, _size: int, _mtime_ns: int, key: tuple[Any, ...], local_gpus: int) -> WeightSplit:
    overrides, n_cpu_moe, n_gpu_layers, devices = key
    params = RuntimeParams(override_tensors=list(overrides) or None, n_cpu_moe=n_cpu_moe, n_gpu_layers=n_gpu_layers,
                           devices=list(devices) if devices is not None else None)
    return split(gguf_meta.tensor_table(path), params, local_gpus)


def host_bytes(path: Path, params: RuntimeParams, local_gpus: int) -> int:
    """Bytes of ``path``'s weights a load with ``params`` keeps in host memory (what an engine reports
    to routing for each model on disk)."""
    return placement_split(path, params, local_gpus).host

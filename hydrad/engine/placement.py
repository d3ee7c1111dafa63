"""Where a model's tensors go: this engine's own devices, and in COMBINE its peers' devices.

``rpc_servers`` names peers (their merged ports); their devices join this engine's own after
a handshake (:mod:`hydrad.engine.rpc.peer_probe`), because llama.cpp's ggml-RPC client aborts
the process on a peer that is down. The device order is fixed: this engine's GPUs first, then
each peer's devices in the order of ``rpc_servers``; ``tensor_split`` gives one share per
device in that order. On a host without a GPU the first share is this engine's CPU: llama.cpp
keeps on the CPU whatever it does not offload, so the share becomes a layer count
(``n_gpu_layers``). ``override_tensors`` follows llama.cpp's ``-ot``:
``REGEX=BUFFER_TYPE``, where the buffer type is a name llama.cpp knows (``CPU``, ``CUDA0``,
``RPC0[host:port]``) or a short name for a peer's device: ``RPC`` (the first) or ``RPC<i>``
(the i-th, counting every peer's devices in order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydrad.common.params import RuntimeParams
from hydrad.engine import ggml, gguf_meta
from hydrad.engine.rpc.peer_probe import PeerInfo, PeerUnavailable, probe


class PlacementError(ValueError):
    """The placement asked for cannot be built; the message says which field and why."""


@dataclass
class Placement:
    """What Model.load gives llama.cpp, and what the engine reports about its pair."""

    devices: list[int] = field(default_factory=list)  # ggml device handles; empty = llama.cpp's own choice
    device_names: list[str] = field(default_factory=list)
    n_gpu_layers: int = 999
    tensor_split: list[float] | None = None
    overrides: list[tuple[str, int]] = field(default_factory=list)  # (pattern, buffer type)
    override_names: list[str] = field(default_factory=list)
    peers: list[PeerInfo] = field(default_factory=list)
    cpu_share: float | None = None  # a GPU-less head: the share of layers kept on this CPU

    @property
    def combined(self) -> bool:
        return bool(self.peers)

    def public(self) -> dict[str, Any]:
        return {"role": "head" if self.peers else "solo", "devices": self.device_names,
                "n_gpu_layers": self.n_gpu_layers, "tensor_split": self.tensor_split,
                "cpu_share": self.cpu_share, "override_tensors": self.override_names,
                "peers": [p.public() for p in self.peers]}


def _local_gpus() -> list[ggml.Device]:
    return [d for d in ggml.devices() if d.kind in ("gpu", "igpu") and not d.name.upper().startswith("RPC")]


def _cpu_device() -> ggml.Device | None:
    return next((d for d in ggml.devices() if d.kind == "cpu"), None)


def _shares(split: list[float] | None, n: int) -> list[float]:
    if split is None:
        return [1.0 / n] * n
    if len(split) != n:
        raise PlacementError(f"tensor_split: {len(split)} shares for {n} devices (own first, then each peer's)")
    if any(x < 0 for x in split) or sum(split) <= 0:
        raise PlacementError("tensor_split: shares must be non-negative and not all zero")
    total = sum(split)
    return [x / total for x in split]


def plan(path: Path, params: RuntimeParams, probe_timeout: float = 3.0) -> Placement | None:
    """The placement for ``params``, or None when llama.cpp's defaults do (no peer, no override).

    Runs on the loader thread: the handshakes block for at most ``probe_timeout`` a peer."""
    if not params.rpc_servers and not params.override_tensors:
        return None
    pl = Placement(n_gpu_layers=999 if params.n_gpu_layers < 0 else params.n_gpu_layers)
    own = _local_gpus() if params.n_gpu_layers != 0 else []
    peer_devs: list[int] = []
    for endpoint in params.rpc_servers or []:
        try:
            info = probe(endpoint, probe_timeout)
        except PeerUnavailable as exc:
            raise PlacementError(f"rpc_servers: {exc}") from None
        handles = ggml.add_rpc_server(endpoint)
        if len(handles) != len(info.devices):
            raise PlacementError(f"rpc_servers: peer {endpoint} lists {len(handles)} devices to llama.cpp "
                                 f"and {len(info.devices)} to the handshake")
        pl.peers.append(info)
        peer_devs.extend(handles)
    if params.rpc_servers:
        if own:
            pl.devices = [d.handle for d in own] + peer_devs
            pl.tensor_split = _shares(params.tensor_split, len(pl.devices))
        else:
            shares = _shares(params.tensor_split, 1 + len(peer_devs))
            pl.cpu_share = shares[0]
            n_layer = gguf_meta.block_count(path)
            kept = round(n_layer * shares[0])
            # llama.cpp offloads the last n_gpu_layers - 1 layers and the output layer
            pl.n_gpu_layers = 999 if kept == 0 else n_layer - kept + 1 if kept < n_layer else 0
            pl.devices = peer_devs
            pl.tensor_split = shares[1:] if len(peer_devs) > 1 else None
        pl.device_names = [d.name for d in own] + [ggml.buffer_type(h)[1] for h in peer_devs]
    elif own:
        pl.devices = [d.handle for d in own]
        pl.device_names = [d.name for d in own]
        pl.tensor_split = list(params.tensor_split) if params.tensor_split else None
    if params.override_tensors:
        pl.overrides, pl.override_names = _overrides(params.override_tensors, own, peer_devs)
    return pl


def _overrides(items: list[str], own: list[ggml.Device], peer_devs: list[int]) -> tuple[list[tuple[str, int]], list[str]]:
    bufts: dict[str, int] = {}
    cpu = _cpu_device()
    if cpu is not None:
        handle, name = ggml.buffer_type(cpu.handle)
        bufts[name.upper()] = handle
    for d in own:
        handle, name = ggml.buffer_type(d.handle)
        bufts[name.upper()] = handle
    for i, dev in enumerate(peer_devs):
        handle, name = ggml.buffer_type(dev)
        bufts[name.upper()] = handle
        bufts[f"RPC{i}"] = handle
        if i == 0:
            bufts["RPC"] = handle
    out: list[tuple[str, int]] = []
    names: list[str] = []
    for item in items:
        pattern, sep, target = item.rpartition("=")
        if not sep or not pattern:
            raise PlacementError(f"override_tensors: {item!r} is not REGEX=BUFFER_TYPE")
        buft = bufts.get(target.strip().upper())
        if buft is None:
            known = ", ".join(sorted(k for k in bufts if not re.fullmatch(r"RPC\d*", k))) or "none"
            short = " (RPC, RPC<i> name a peer's device)" if peer_devs else " (no peer: rpc_servers is empty)"
            raise PlacementError(f"override_tensors: unknown buffer type {target!r} in {item!r}; known: {known}{short}")
        out.append((pattern, buft))
        names.append(item)
    return out, names

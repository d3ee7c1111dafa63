"""A generation's LoRA adapters and control vector: loaded with its model (T3), applied per decode step.

llama.cpp applies LoRA adapters per *context* (``llama_set_adapters_lora``), not per sequence: one
``llama_decode`` computes every row of its batch under the same adapter scales. Requests may each ask for
their own scales (llama-server's per-request ``lora``), so the scheduler puts only the slots of one
adapter set into a step and takes the sets in turns (:meth:`Adapters.pick`); a step never mixes two,
which would compute some rows under scales their request did not ask for. Serializing costs throughput
only while requests of different sets run at once; requests of one set batch as before. Switching sets
also makes llama.cpp reserve its compute graph again, so a set keeps the context for as long as it is
the only one with work.

KV computed under one adapter set is not the KV of another (the adapted projections change keys and
values), so the adapters' files and scales, and the control vector, are part of a slot's cache
namespace (:meth:`Adapters.owner`): a prompt never reuses, shares or restores a prefix computed under
other ones. Without a control vector, a set of all zeros is the base model, with the plain namespace.

The control vector (the sum of ``control_vectors`` times their scales) is the same for every request:
it is set on the context when the context is made and never changes until the next load.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydrad.engine.filedigest import edge_digest
from hydrad.common.params import MAX_ADAPTER_SCALE, AdapterFile, RuntimeParams
from hydrad.engine import gguf_meta, llama

GGML_F32 = 0
MAX_REQUEST_ENTRIES = 64
"""Entries of a request's ``lora`` list (llama-server takes any number; the last of an id wins)."""


class AdapterRefused(ValueError):
    """A request's or POST /lora-adapters' ``lora`` list that names no loaded adapter, or a bad scale."""


@dataclass(frozen=True)
class Lora:
    """One loaded adapter: its id (position in ``lora_adapters``), its file and its llama.cpp handle,
    which lives as long as the model (llama.cpp frees a model's adapters with it)."""

    id: int
    path: Path
    handle: Any
    ident: str = ""  # which file it is (file_ident): KV computed under it is keyed by it


_IDENT_EDGE = 1 << 20


def file_ident(path: Path) -> str:
    """sha256 over an adapter file's size and its first and last MiB: another file (retrained, say) at
    the same path and id is another adapter, whose KV a prefix checkpoint of the old one must not serve."""
    return edge_digest(path, _IDENT_EDGE)[:16]


def resolve_file(param: str, given: str, models_dir: Path) -> Path:
    """An adapter's file, as a model's: absolute, or under models_dir; LoadError naming ``param``."""
    p = Path(given)
    path = p if p.is_absolute() else models_dir / p
    if not path.is_file():
        raise llama.LoadError(f"{param}: no such file: {given} (an absolute path, or one under {models_dir})")
    return path


def load_lora(model: llama.Model, path: Path, index: int) -> Any:
    """``llama_adapter_lora_init`` on the loader thread; a refusal (another architecture, tensors that do
    not fit the model's) fails the load naming ``lora_adapters`` and llama.cpp's reason."""
    handle, log = llama.logged(lambda: llama.lib().llama_adapter_lora_init(model.ptr, str(path).encode()))
    if not handle:
        errors = [ln.strip() for ln in log.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
        why = "; ".join(errors[-2:])[:600] or "not a LoRA adapter GGUF llama.cpp can read"
        raise llama.LoadError(f"lora_adapters[{index}]: llama.cpp refused {path.name} for {model.info.arch} "
                              f"({why})")
    return handle


def control_vector(specs: Sequence[AdapterFile], models_dir: Path, n_embd: int, n_layer: int) -> Any:
    """The control vectors summed times their scales, as llama-server sums them: ``n_embd`` floats per
    layer from layer 1 (llama.cpp's layout). Each file's ``direction.<layer>`` tensors must be F32
    vectors of the model's width; LoadError naming ``control_vectors`` otherwise."""
    import numpy as np  # here, not at import: libllama is loaded before numpy (llama.preload_native)

    out = np.zeros((max(n_layer - 1, 1), n_embd), dtype=np.float32)
    for i, spec in enumerate(specs):
        where = f"control_vectors[{i}]"
        path = resolve_file(where, spec.path, models_dir)
        try:
            _, infos = gguf_meta.tensor_infos(path)
        except (OSError, gguf_meta.GgufError) as exc:
            raise llama.LoadError(f"{where}: {path.name} is not a GGUF control vector ({exc})") from None
        found = 0
        with open(path, "rb") as f:
            for t in infos:
                head, _, layer = t.name.partition(".")
                if head != "direction" or not layer.isdigit() or not 1 <= int(layer) <= n_layer:
                    raise llama.LoadError(f"{where}: {path.name} has tensor {t.name!r}; a control vector holds "
                                          f"direction.<layer> tensors, layers 1 to {n_layer}")
                if t.ggml_type != GGML_F32 or t.shape != (n_embd,):
                    raise llama.LoadError(f"{where}: {t.name} in {path.name} is not {n_embd} F32 values (the "
                                          f"model's n_embd): shape {list(t.shape)}, type {t.ggml_type}")
                f.seek(t.offset)
                data = np.frombuffer(f.read(4 * n_embd), dtype=np.float32)
                if data.size != n_embd:
                    raise llama.LoadError(f"{where}: {path.name} is truncated")
                if int(layer) < n_layer:  # llama.cpp has no control tensor for the last layer's output
                    out[int(layer) - 1] += data * np.float32(spec.scale)
                found += 1
        if not found:
            raise llama.LoadError(f"{where}: {path.name} holds no direction.<layer> tensor")
    return np.ascontiguousarray(out.reshape(-1))


class Adapters:
    """A generation's adapters: the LoRAs and their scales, the control vector. The adapters and the
    vector are fixed at load; the scales a request naming none runs with (``defaults``) are replaced
    whole by POST /lora-adapters (a tuple: the engine thread reads it at admission without a lock);
    ``applied`` (engine thread only) is what the context computes with now."""

    def __init__(self, loras: list[Lora], defaults: tuple[float, ...], cvec: Any = None,
                 cvec_range: tuple[int, int] = (-1, -1), n_embd: int = 0) -> None:
        self.loras = loras
        self.defaults = defaults
        self.cvec = cvec
        self.cvec_range = cvec_range
        self.n_embd = n_embd
        # the control vector's values and layers: it changes every prompt's KV, so it keys the cache too
        self.cvec_ident = "" if cvec is None else hashlib.sha256(
            cvec.tobytes() + repr(cvec_range).encode()).hexdigest()[:16]
        self.applied: tuple[float, ...] | None = None  # None: not set on this context yet
        self._handles: Any = None  # the handles as llama_set_adapters_lora takes them, made at the first use
        self._set_lock = threading.Lock()  # POST /lora-adapters from several connections at once

    @classmethod
    def build(cls, model: llama.Model, params: RuntimeParams, models_dir: Path) -> Adapters | None:
        """Loader thread: load what ``params`` names (None when it names nothing); LoadError naming the
        parameter at fault."""
        if not params.lora_adapters and not params.control_vectors:
            return None
        info = model.info
        loras = [Lora(i, path, load_lora(model, path, i), file_ident(path))
                 for i, spec in enumerate(params.lora_adapters or [])
                 for path in [resolve_file(f"lora_adapters[{i}]", spec.path, models_dir)]]
        defaults = tuple(0.0 if params.lora_init_without_apply else float(s.scale)
                         for s in params.lora_adapters or [])
        cvec, span = None, (-1, -1)
        if params.control_vectors:
            cvec = control_vector(params.control_vectors, models_dir, info.n_embd, info.n_layer)
            start, end = params.control_vector_layer_range or (0, 0)
            span = (start or 1, end or info.n_layer)
        return cls(loras, defaults, cvec, span, info.n_embd)

    # ----- scales ----------------------------------------------------------------------------------

    def scales(self, asked: Sequence[Any] | None) -> tuple[float, ...]:
        """The scales a request runs with: the defaults when it names none; else llama-server's rule,
        each adapter it names at its scale (the last of an id), every other at 0."""
        if not asked:
            return self.defaults
        out = [0.0] * len(self.loras)
        for entry in asked:
            if not 0 <= entry.id < len(self.loras):
                raise AdapterRefused(f"lora: no adapter {entry.id} (this model has {len(self.loras)}: ids 0 to "
                                     f"{len(self.loras) - 1}; GET /lora-adapters lists them)"
                                     if self.loras else "lora: this model has no LoRA adapters (lora_adapters)")
            if not abs(entry.scale) <= MAX_ADAPTER_SCALE:
                raise AdapterRefused(f"lora: scale {entry.scale} outside ±{MAX_ADAPTER_SCALE:g}")
            out[entry.id] = float(entry.scale)
        return tuple(out)

    def set_defaults(self, asked: Sequence[Any]) -> tuple[float, ...]:
        """POST /lora-adapters: the scales of requests naming none, from now on (the adapters it does
        not name: 0, as llama-server sets them)."""
        with self._set_lock:
            self.defaults = self.scales(asked) if asked else tuple(0.0 for _ in self.loras)
            return self.defaults

    def owner(self, ns: str, scales: tuple[float, ...]) -> str:
        """The cache namespace of a request of namespace ``ns`` running under ``scales``: its own for
        every distinct set of adapters (their files) and nonzero scales, and for the control vector in
        force; ``ns`` itself for the base model. Prefix checkpoints outlive a generation, so the files
        count, not only the ids."""
        lora = ",".join(f"{self.loras[i].ident}:{float(s)!r}" for i, s in enumerate(scales) if s)
        if not lora and not self.cvec_ident:
            return ns
        text = f"{self.cvec_ident};{lora}"
        return f"{ns}|adapters:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def public(self) -> list[dict[str, Any]]:
        """GET /lora-adapters, as llama-server answers it."""
        defaults = self.defaults
        return [{"id": lo.id, "path": str(lo.path), "scale": defaults[lo.id]} for lo in self.loras]

    # ----- the context (engine thread) ---------------------------------------------------------------

    @staticmethod
    def pick(sets: Sequence[tuple[float, ...]], turn: int) -> tuple[float, ...]:
        """The adapter set of the next step among those with work: the only one, else the sets in turns
        (``turn``: the steps that had to choose so far), in a fixed order."""
        distinct = sorted(set(sets))
        if len(distinct) == 1:
            return distinct[0]
        return distinct[turn % len(distinct)]

    def use(self, ctx: llama.Context, scales: tuple[float, ...]) -> bool:
        """Compute the next steps under ``scales``; True when that changed the context's adapters."""
        if scales == self.applied or not self.loras:
            return False
        if self._handles is None:
            self._handles = (llama.lib().llama_adapter_lora_p_ctypes * len(self.loras))(*[lo.handle for lo in self.loras])
        arr = (ctypes.c_float * len(scales))(*scales)
        llama.lib().llama_set_adapters_lora(ctx.ptr, self._handles, len(scales), arr)
        self.applied = scales
        return True

    def attach(self, ctx: llama.Context) -> None:
        """A new context (load, rebuild): no LoRA set on it yet, the control vector set."""
        self.applied = None
        if self.cvec is None:
            return
        data = self.cvec.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if llama.lib().llama_set_adapter_cvec(ctx.ptr, data, self.cvec.size, self.n_embd, *self.cvec_range) != 0:
            raise llama.LoadError("control_vectors: llama.cpp refused the control vector for this context")


def for_request(adapters: Adapters | None, lora: Sequence[Any] | None, ns: str) -> tuple[tuple[float, ...], str]:
    """The adapter scales a request runs with and its cache namespace under them (``ns`` widened by the
    adapters, :meth:`Adapters.owner`); AdapterRefused when its ``lora`` names no loaded adapter."""
    if adapters is None:
        if lora:
            raise AdapterRefused("lora: this model has no LoRA adapters (the engine's lora_adapters)")
        return (), ns
    if not adapters.loras and lora:
        raise AdapterRefused("lora: this model has no LoRA adapters (the engine's lora_adapters)")
    scales = adapters.scales(lora)
    return scales, adapters.owner(ns, scales)

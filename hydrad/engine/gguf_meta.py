"""The few GGUF header values the engine needs before llama.cpp loads a model.

A COMBINE head on a host without a GPU keeps its share of the layers on its CPU, which llama.cpp
expresses as a layer count (``n_gpu_layers``), not a fraction: turning ``tensor_split`` into
that count needs the model's block count before the load. Reading it here costs a scan of the
header (the vocabulary arrays are skipped by their lengths), not a second model load.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

# GGUF value types: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20


class GgufError(ValueError):
    """Not a GGUF file this reader understands (the message says what was wrong)."""


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise GgufError("truncated header")
    return b


def _string(f: BinaryIO) -> bytes:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > 1 << 24:
        raise GgufError(f"string of {n} bytes in the header")
    return _read(f, n)


def _value(f: BinaryIO, vtype: int) -> Any:
    """A scalar or string value; arrays are skipped (None), the file left just past the value."""
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        (v,) = struct.unpack(fmt, _read(f, struct.calcsize(fmt)))
        return v
    if vtype == _STRING:
        return _string(f).decode("utf-8", "replace")
    if vtype == _ARRAY:
        (etype,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if etype in _SCALAR:
            f.seek(count * struct.calcsize(_SCALAR[etype]), 1)
        elif etype == _STRING:
            _skip_strings(f, count)
        else:
            raise GgufError(f"array of type {etype}")
        return None
    raise GgufError(f"value type {vtype}")


_U64 = struct.Struct("<Q")
_CHUNK = 1 << 20


def _skip_strings(f: BinaryIO, count: int) -> None:
    """Skip ``count`` length-prefixed strings, walked in a buffer read a megabyte at a time rather than
    with a read and a seek per string. The walk is the only Python loop of a header scan, and it runs on
    the loader thread while the engine thread serves: a scan that takes long holds the engine's steps
    up, each time they need the interpreter back from a llama.cpp call."""
    base, buf, p = f.tell(), b"", 0
    unpack = _U64.unpack_from
    for _ in range(count):
        if p + 8 > len(buf):
            base += p
            f.seek(base)
            buf, p = f.read(_CHUNK), 0
            if len(buf) < 8:
                raise GgufError("truncated header")
        (n,) = unpack(buf, p)
        if n > 1 << 24:
            raise GgufError(f"string of {n} bytes in the header")
        p += 8 + n
    f.seek(base + p)


def _open_header(f: BinaryIO, path: Path) -> tuple[int, int]:
    """Check the magic and version; the numbers of tensors and of header values that follow."""
    if _read(f, 4) != b"GGUF":
        raise GgufError(f"{path} is not a GGUF file")
    (version,) = struct.unpack("<I", _read(f, 4))
    if version < 2:
        raise GgufError(f"GGUF version {version}")
    n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
    if n_kv > MAX_KV:
        raise GgufError(f"{n_kv} header values")
    if n_tensors > MAX_TENSORS:
        raise GgufError(f"{n_tensors} tensors")
    return n_tensors, n_kv


def _values(f: BinaryIO, n_kv: int) -> Iterator[tuple[str, Any]]:
    """Each header value's key and value (None for an array, skipped), the file left just past it."""
    for _ in range(n_kv):
        key = _string(f).decode("utf-8", "replace")
        (vtype,) = struct.unpack("<I", _read(f, 4))
        yield key, _value(f, vtype)


def metadata(path: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """Scalar and string header values (arrays are skipped), all or only ``keys``."""
    with open(path, "rb") as f:
        _, n_kv = _open_header(f, path)
        return {k: v for k, v in _values(f, n_kv) if v is not None and (keys is None or k in keys)}


def vocab_digest(path: Path) -> str:
    """A digest of the vocabulary as the file stores it (the tokenizer model, its pre-tokenizer and
    the raw bytes of the token list): two quants of one model have the same, so KV computed from the
    token ids of one means the same on the other. The token list is hashed in place, not decoded.

    Kept per file (path, size, modification time): a reload of a model read before costs nothing, and
    the scan (tens of milliseconds of Python on the loader thread for a large vocabulary, slowing the
    serving generation's steps meanwhile) runs once per file."""
    st = path.stat()
    return _vocab_digest(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _vocab_digest(path: Path, _size: int, _mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        _, n_kv = _open_header(f, path)
        found: list[bytes] = []
        for _ in range(n_kv):
            key = _string(f).decode("utf-8", "replace")
            (vtype,) = struct.unpack("<I", _read(f, 4))
            start = f.tell()
            _value(f, vtype)
            if key in _VOCAB_KEYS:
                end = f.tell()
                f.seek(start)
                found.append(key.encode() + b"=" + _read(f, end - start))
                if len(found) == len(_VOCAB_KEYS):  # the rest (merges: as long again) is not needed
                    break
        for part in sorted(found):  # in key order, whatever order the file stores them in
            h.update(part)
    return h.hexdigest()[:32]


def tensor_names(path: Path) -> frozenset[str]:
    """The names of the tensors the file holds; empty for one part of a split model (its tensors are only
    some of the model's). Not cached: its one reader, ``bench_load_stall --hold-alloc``, asks once a run."""
    names: set[str] = set()
    with open(path, "rb") as f:
        n_tensors, n_kv = _open_header(f, path)
        for key, value in _values(f, n_kv):
            if key == "split.count" and isinstance(value, int) and value > 1:
                return frozenset()
        for _ in range(n_tensors):
            names.add(_string(f).decode("utf-8", "replace"))
            (n_dims,) = struct.unpack("<I", _read(f, 4))
            if n_dims > 8:
                raise GgufError(f"a tensor of {n_dims} dimensions")
            f.seek(8 * n_dims + 4 + 8, 1)  # the dimensions, the type, the data offset
    return frozenset(names)


_VOCAB_KEYS = {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens"}

# A header value's GGUF type as a kv_overrides TYPE (llama_model_kv_override_type): what an override of
# that key must be for llama.cpp to use it (GGUFMeta's validate_override compares exactly these).
_KV_KIND = {0: "int", 1: "int", 2: "int", 3: "int", 4: "int", 5: "int", 10: "int", 11: "int", 6: "float", 12: "float",
            7: "bool", _STRING: "str", _ARRAY: "array"}


def key_kinds(path: Path) -> dict[str, str]:
    """Each header key's kind, as a kv override would have to be typed: int, float, bool, str, or array
    (which llama.cpp never overrides)."""
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        _, n_kv = _open_header(f, path)
        for _ in range(n_kv):
            key = _string(f).decode("utf-8", "replace")
            (vtype,) = struct.unpack("<I", _read(f, 4))
            _value(f, vtype)
            out[key] = _KV_KIND.get(vtype, "unknown")
    return out


@dataclass(frozen=True)
class TensorTable:
    """The tensors of a GGUF file, each with the bytes its data takes in the file."""

    sizes: dict[str, int]  # name -> bytes, in file order
    n_layer: int  # <arch>.block_count, 0 if the header names none
    split: bool  # one part of a split model: the other parts' tensors are not here

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


def tensor_table(path: Path) -> TensorTable:
    """Every tensor's name and size, for an estimate of where a load puts the weights before llama.cpp
    reads them. A size is the distance to the next tensor's data (the last one's: to the end of the
    file), so it includes the alignment padding after it (under ``general.alignment`` bytes, 32 by
    default): exact enough for memory estimates, and no table of ggml's block sizes is needed. Kept per
    file (path, size, modification time): routing asks for every model on disk at each registration."""
    st = path.stat()
    return _tensor_table(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _tensor_table(path: Path, size: int, _mtime_ns: int) -> TensorTable:
    with open(path, "rb") as f:
        n_tensors, n_kv = _open_header(f, path)
        meta = {k: v for k, v in _values(f, n_kv) if v is not None}
        infos: list[tuple[str, int]] = []
        for _ in range(n_tensors):
            name = _string(f).decode("utf-8", "replace")
            (n_dims,) = struct.unpack("<I", _read(f, 4))
            if n_dims > 8:
                raise GgufError(f"a tensor of {n_dims} dimensions")
            f.seek(8 * n_dims + 4, 1)  # the dimensions and the type
            (offset,) = struct.unpack("<Q", _read(f, 8))
            infos.append((name, offset))
        align = meta.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0:
            raise GgufError(f"general.alignment {align!r}")
        data_start = -(-f.tell() // align) * align
    ends = sorted({off for _, off in infos} | {size - data_start})
    following = {a: b for a, b in zip(ends, ends[1:])}
    if any(off not in following for _, off in infos):
        raise GgufError(f"{path}: a tensor's data lies past the end of the file")
    arch = meta.get("general.architecture")
    n_layer = meta.get(f"{arch}.block_count")
    return TensorTable(sizes={name: following[off] - off for name, off in infos},
                       n_layer=n_layer if isinstance(n_layer, int) and n_layer > 0 else 0,
                       split=isinstance(meta.get("split.count"), int) and meta["split.count"] > 1)


def block_count(path: Path) -> int:
    """The model's number of repeating layers (``<arch>.block_count``)."""
    meta = metadata(path)
    arch = meta.get("general.architecture")
    n = meta.get(f"{arch}.block_count")
    if not isinstance(n, int) or n <= 0:
        raise GgufError(f"{path} names no block count for architecture {arch!r}")
    return n


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file as its header describes it: ``shape`` in ggml's order (``ne``), its ggml
    type, and where its data starts in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


def tensor_infos(path: Path, limit: int = 4096) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The header values and every tensor's description, for a small file whose data the caller reads
    itself (a control vector); at most ``limit`` tensors."""
    with open(path, "rb") as f:
        n_tensors, n_kv = _open_header(f, path)
        if n_tensors > limit:
            raise GgufError(f"{n_tensors} tensors (at most {limit})")
        meta = {k: v for k, v in _values(f, n_kv) if v is not None}
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = _string(f).decode("utf-8", "replace")
            (n_dims,) = struct.unpack("<I", _read(f, 4))
            if n_dims > 8:
                raise GgufError(f"a tensor of {n_dims} dimensions")
            shape = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims))
            ggml_type, offset = struct.unpack("<IQ", _read(f, 12))
            raw.append((name, shape, ggml_type, offset))
        align = meta.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0:
            raise GgufError(f"general.alignment {align!r}")
        data_start = -(-f.tell() // align) * align
    return meta, [TensorInfo(n, s, t, data_start + o) for n, s, t, o in raw]

"""The few GGUF header values the engine needs before llama.cpp loads a model.

A COMBINE head on a host without a GPU keeps its share of the layers on its CPU, which llama.cpp
expresses as a layer count (``n_gpu_layers``), not a fraction: turning ``tensor_split`` into
that count needs the model's block count before the load. Reading it here costs a scan of the
header (the vocabulary arrays are skipped by their lengths), not a second model load.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any, BinaryIO

# GGUF value types: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_KV = 1 << 20


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
            for _ in range(count):
                (n,) = struct.unpack("<Q", _read(f, 8))
                f.seek(n, 1)
        else:
            raise GgufError(f"array of type {etype}")
        return None
    raise GgufError(f"value type {vtype}")


def _open_header(f: BinaryIO, path: Path) -> int:
    """Check the magic and version; the number of header values that follow."""
    if _read(f, 4) != b"GGUF":
        raise GgufError(f"{path} is not a GGUF file")
    (version,) = struct.unpack("<I", _read(f, 4))
    if version < 2:
        raise GgufError(f"GGUF version {version}")
    _n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
    if n_kv > MAX_KV:
        raise GgufError(f"{n_kv} header values")
    return n_kv


def metadata(path: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """Scalar and string header values (arrays are skipped), all or only ``keys``."""
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        n_kv = _open_header(f, path)
        for _ in range(n_kv):
            key = _string(f).decode("utf-8", "replace")
            (vtype,) = struct.unpack("<I", _read(f, 4))
            value = _value(f, vtype)
            if value is not None and (keys is None or key in keys):
                out[key] = value
    return out


def vocab_digest(path: Path) -> str:
    """A digest of the vocabulary as the file stores it (the tokenizer model, its pre-tokenizer and
    the raw bytes of the token list): two quants of one model have the same, so KV computed from the
    token ids of one means the same on the other. The token list is hashed in place, not decoded."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n_kv = _open_header(f, path)
        for _ in range(n_kv):
            key = _string(f).decode("utf-8", "replace")
            (vtype,) = struct.unpack("<I", _read(f, 4))
            start = f.tell()
            value = _value(f, vtype)
            if key in _VOCAB_KEYS:
                end = f.tell()
                f.seek(start)
                h.update(key.encode() + b"=" + _read(f, end - start))
            del value
    return h.hexdigest()[:32]


_VOCAB_KEYS = {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens"}


def block_count(path: Path) -> int:
    """The model's number of repeating layers (``<arch>.block_count``)."""
    meta = metadata(path)
    arch = meta.get("general.architecture")
    n = meta.get(f"{arch}.block_count")
    if not isinstance(n, int) or n <= 0:
        raise GgufError(f"{path} names no block count for architecture {arch!r}")
    return n

"""How a load's parameters reach llama.cpp's model parameters where a field is more than a value: the
load mode of ``use_mmap`` / ``use_mlock`` / ``use_direct_io``, a ``tensor_buft_overrides`` entry, and
the reason a refused load is given (a failure a parameter causes starts with that parameter's name).
:mod:`hydrad.engine.llama` loads with them."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from hydrad.common.params import RuntimeParams


def load_mode(params: RuntimeParams) -> int:
    """llama.cpp's ``llama_load_mode`` for ``use_mmap``, ``use_mlock`` and ``use_direct_io``, as
    llama-server's ``--load-mode`` names them: direct I/O (``dio``) over everything else, then mmap+mlock
    or mlock (a read, locked), else llama.cpp's own choice when mapping (it maps where every device can
    use the mapping) or a plain read. The parameters refuse direct I/O with mlock."""
    if params.use_direct_io:
        return 4  # LLAMA_LOAD_MODE_DIRECT_IO
    if params.use_mlock:
        return 3 if params.use_mmap else 2  # LLAMA_LOAD_MODE_MMAP_MLOCK, LLAMA_LOAD_MODE_MLOCK
    return _LOAD_MODE[params.use_mmap]


# use_mmap: llama.cpp's own choice (it maps the file where every device can use the mapping) or a read
_LOAD_MODE = {True: -1, False: 0}  # LLAMA_LOAD_MODE_AUTO, LLAMA_LOAD_MODE_NONE


class BuftOverride(ctypes.Structure):
    """llama.cpp's ``llama_model_tensor_buft_override``: a tensor-name regex and a buffer type."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


_TENSOR_INVALID = re.compile(r"tensor '([^']*)' has invalid data")


def load_failure(path: Path, text: str, params: RuntimeParams) -> str:
    """Why llama.cpp refused a model, from what it logged while trying: a failure a load parameter
    causes starts with that parameter's name (what :func:`hydrad.common.params.param_named` reads)."""
    bad = _TENSOR_INVALID.findall(text)
    if bad and params.check_tensors:
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        return (f"check_tensors: {path.name} has invalid data (NaN, infinity or bad quantization blocks) in "
                f"{', '.join(bad[:8])}{more}")
    errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower() or "failed" in ln.lower()]
    why = "; ".join(errors[-3:])[:1000] if errors else "not a GGUF it can read, truncated, or out of memory; see the log"
    return f"llama.cpp could not load {path} ({why})"

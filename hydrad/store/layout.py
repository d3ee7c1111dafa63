"""llama.cpp's per-sequence KV state bytes (``llama_state_seq_get_data``), cut into parts.

The bytes are an outer header (``llama_context::state_seq_get_data``: u32 io magic, i32 seq_id), then
what ``llama_kv_cache::state_write`` writes (vendor/llama.cpp/src/llama-kv-cache.cpp),
once per KV cache of the memory (a model with sliding-window layers writes two caches back to back):

    u32 n_stream
    per stream: u32 cell_count; when > 0:
        per cell:  i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id          (the "meta")
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_size, cell_count x k_row_size   (K, one row per cell)
        per layer, v_trans == 0: i32 v_type, u64 v_row_size, cell_count x v_row_size
        per layer, v_trans == 1: i32 v_type, u32 v_el_size, u32 n_embd_v,
                                 n_embd_v x (cell_count x v_el_size)     (V transposed: element-major)

Why parse at all: the K rows (and V) of the cells at positions 0..k-1 depend only on the first k tokens,
so cutting every per-cell section at the same token-block boundaries gives chunks that two sessions
sharing a prefix hold byte for byte. Transposed V is cut the same way: the chunk of block b holds, for
each of the n_embd_v rows, that row's slice of the block's cells (so V dedups as well as K), and is
put back row by row on reassembly.

Bytes that do not parse exactly (another memory type, cells with extra per-cell data, a future format)
are kept as a plain blob in fixed-size chunks: storing never fails, it only stops deduplicating.

A layout is a list of parts, in byte order:
    ("raw", bytes)               literal header bytes, kept inline in the manifest
    ("cells", n)                 a stream's u32 cell_count (rewritten when truncating)
    ("rows", row_size, offset, n)      n rows of row_size bytes, starting at offset
    ("vtrans", el, n_embd, offset, n)  n_embd rows of n x el bytes
    ("blob", offset, length)     anything else
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IO_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic
MAX_STREAMS = 256
MAX_LAYERS = 4096
MAX_SEQ_IDS = 4096


class _Short(Exception):
    pass


@dataclass
class Parsed:
    """How a state's bytes split. ``truncatable``: one cache, one stream, cells at positions 0..n-1 in
    order with same-size meta rows, so the first k cells (k on a block boundary) form a valid state."""

    kind: str  # "kv" or "blob"
    cells: int
    parts: list[tuple[Any, ...]] = field(default_factory=list)
    truncatable: bool = False
    why: str = ""  # why a blob: what did not parse


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.off = data, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.off + size > len(self.data):
            raise _Short(f"header past the end at byte {self.off}")
        (v,) = struct.unpack_from(fmt, self.data, self.off)
        self.off += size
        return int(v)

    def skip(self, n: int) -> int:
        if n < 0 or self.off + n > len(self.data):
            raise _Short(f"{n} bytes of data past the end at byte {self.off}")
        start = self.off
        self.off += n
        return start


def parse(data: bytes | memoryview) -> Parsed:
    """Split ``data`` into parts; a blob when it is not exactly llama.cpp's KV seq-state layout."""
    view = memoryview(data)
    try:
        return _parse_kv(view)
    except (_Short, ValueError) as exc:
        return Parsed("blob", 0, [("blob", 0, len(view))], False, str(exc))


def _parse_kv(view: memoryview) -> Parsed:
    r = _Reader(view)
    parts: list[tuple[Any, ...]] = []
    raw_from = 0
    n_caches = n_streams = 0
    cells_total = 0
    positions_ok = True
    meta_uniform = True

    def flush_raw(upto: int) -> None:
        nonlocal raw_from
        if upto > raw_from:
            parts.append(("raw", bytes(view[raw_from:upto])))
        raw_from = upto

    if len(view) == 0:
        raise ValueError("empty state")
    magic = r.take("<I")
    if magic != IO_MAGIC:
        raise ValueError(f"io magic {magic:#x}, not llama.cpp's {IO_MAGIC:#x}")
    r.take("<i")  # the source sequence id, kept as raw header bytes
    while r.off < len(view):
        n_caches += 1
        n_stream = r.take("<I")
        if not 1 <= n_stream <= MAX_STREAMS:
            raise ValueError(f"n_stream {n_stream} out of range")
        for _ in range(n_stream):
            at = r.off
            cells = r.take("<I")
            if cells == 0:
                continue
            n_streams += 1
            cells_total = cells
            flush_raw(at)
            parts.append(("cells", cells))
            raw_from = r.off
            # meta: per cell pos, n_seq_id, seq ids
            meta_start = r.off
            for i in range(cells):
                pos = r.take("<i")
                n_seq = r.take("<I")
                if n_seq > MAX_SEQ_IDS:
                    raise ValueError(f"cell {i} claims {n_seq} sequence ids")
                r.skip(4 * n_seq)
                if n_seq != 1:
                    meta_uniform = False
                if pos != i:
                    positions_ok = False
            meta_len = r.off - meta_start
            if meta_uniform and meta_len == 12 * cells:
                parts.append(("rows", 12, meta_start, cells))
            else:
                parts.append(("blob", meta_start, meta_len))
            raw_from = r.off
            v_trans = r.take("<I")
            n_layer = r.take("<I")
            if v_trans not in (0, 1) or not 1 <= n_layer <= MAX_LAYERS:
                raise ValueError(f"v_trans {v_trans} / n_layer {n_layer} out of range")
            for _ in range(n_layer):
                r.take("<i")
                row = r.take("<Q")
                if row == 0 or row > (1 << 30):
                    raise ValueError(f"K row size {row} out of range")
                flush_raw(r.off)
                parts.append(("rows", row, r.skip(row * cells), cells))
                raw_from = r.off
            for _ in range(n_layer):
                r.take("<i")
                if not v_trans:
                    row = r.take("<Q")
                    if row == 0 or row > (1 << 30):
                        raise ValueError(f"V row size {row} out of range")
                    flush_raw(r.off)
                    parts.append(("rows", row, r.skip(row * cells), cells))
                else:
                    el = r.take("<I")
                    n_embd = r.take("<I")
                    if not 1 <= el <= 64 or not 1 <= n_embd <= (1 << 20):
                        raise ValueError(f"V element size {el} / n_embd {n_embd} out of range")
                    flush_raw(r.off)
                    parts.append(("vtrans", el, n_embd, r.skip(el * n_embd * cells), cells))
                raw_from = r.off
    flush_raw(r.off)
    if n_streams == 0:  # an empty sequence: nothing per cell to cut
        return Parsed("kv", 0, [("raw", bytes(view))], False)
    truncatable = n_caches == 1 and n_streams == 1 and positions_ok and meta_uniform
    return Parsed("kv", cells_total if n_streams == 1 else 0, parts, truncatable)


# ---- cutting into block pieces, and putting back -------------------------------------------------

def block_bounds(cells: int, block: int, split: int | None = None) -> list[int]:
    """Chunk boundaries of a per-cell section: every block, plus ``split`` (where this state's tokens
    leave those of the longest matching state already stored) when it falls inside a block.

    A shared prefix rarely ends on a block boundary: cut at blocks only, every session sharing a
    2,366-token system prompt stores that prompt's last partial block again inside a chunk of its own
    (2.3 times the ideal bytes for 64 sessions with short questions). Cut at the divergence point as
    well, the shared part of that block is one chunk that the next sessions find. Block boundaries
    stay boundaries, so prefixes are still cut at blocks."""
    bounds = list(range(0, cells, block)) + [cells]
    if split is not None and 0 < split < cells and split % block:
        bounds.append(split)
        bounds.sort()
    return bounds


def cut(data: bytes | memoryview, parsed: Parsed, block: int, blob_chunk: int,
        split: int | None = None) -> list[list[bytes | memoryview] | bytes]:
    """Per part, its pieces: a list of chunk payloads for data parts, the literal bytes for "raw"/"cells".
    ``split`` applies to the parts of a truncatable state (one cache, one stream) only."""
    view = memoryview(data)
    out: list[list[bytes | memoryview] | bytes] = []
    for part in parsed.parts:
        kind = part[0]
        if kind == "raw":
            out.append(part[1])
        elif kind == "cells":
            out.append(struct.pack("<I", part[1]))
        elif kind in ("rows", "vtrans"):
            cells = part[3] if kind == "rows" else part[4]
            b = block_bounds(cells, block, split if parsed.truncatable and cells == parsed.cells else None)
            spans = list(zip(b, b[1:]))
            if kind == "rows":
                row, off = part[1], part[2]
                out.append([view[off + s * row: off + e * row] for s, e in spans])  # views: hashed and written, not copied
            else:
                el, n_embd, off = part[1], part[2], part[3]
                arr = np.frombuffer(view, dtype=np.uint8, count=n_embd * cells * el, offset=off).reshape(n_embd, cells * el)
                out.append([arr[:, s * el: e * el].tobytes() for s, e in spans])
        else:  # blob: fixed-size pieces
            off, length = part[1], part[2]
            out.append([bytes(view[p: min(p + blob_chunk, off + length)]) for p in range(off, off + length, blob_chunk)])
    return out


def join_vtrans(pieces: list[bytes], el: int, n_embd: int) -> bytes:
    """Blocks of transposed V (each n_embd rows of that block's cells) back to n_embd full rows."""
    mats = [np.frombuffer(p, dtype=np.uint8).reshape(n_embd, -1) for p in pieces]
    return np.concatenate(mats, axis=1).tobytes() if mats else b""


def truncate(data: bytes | memoryview, parsed: Parsed, n: int) -> bytes:
    """The state of the first ``n`` cells of a truncatable state (any ``n``, not only a block boundary):
    what llama.cpp would have written for the sequence had it held only those tokens."""
    if not parsed.truncatable or not 0 < n <= parsed.cells:
        raise ValueError(f"cannot cut a state of {parsed.cells} cells to {n} (truncatable={parsed.truncatable})")
    view = memoryview(data)
    out: list[bytes | memoryview] = []
    for part in parsed.parts:
        kind = part[0]
        if kind == "raw":
            out.append(part[1])
        elif kind == "cells":
            out.append(struct.pack("<I", n))
        elif kind == "rows":
            row, off = part[1], part[2]
            out.append(view[off: off + n * row])
        elif kind == "vtrans":
            el, n_embd, off, cells = part[1], part[2], part[3], part[4]
            arr = np.frombuffer(view, dtype=np.uint8, count=n_embd * cells * el, offset=off).reshape(n_embd, cells * el)
            out.append(arr[:, : n * el].tobytes())
        else:
            raise ValueError("a blob part cannot be cut")
    return b"".join(out)

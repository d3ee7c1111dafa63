"""The parser of llama.cpp's per-sequence state bytes, on real states from SmolLM2."""

from __future__ import annotations

import struct

import pytest

from hydrad.store import layout as L


@pytest.mark.parametrize("kind", ["trans", "rows"])
def test_real_state_parses_into_sections(real_states, kind: str) -> None:
    meta, data = real_states.get("a", kind)
    p = L.parse(data)
    assert p.kind == "kv" and p.why == ""
    assert p.cells == 400 == meta["n_tokens"] and p.truncatable
    kinds = [part[0] for part in p.parts if part[0] != "raw"]
    # cells, meta rows, 30 layers of K rows, 30 layers of V (transposed without flash attention)
    assert kinds == ["cells", "rows"] + ["rows"] * 30 + (["vtrans"] if kind == "trans" else ["rows"]) * 30
    k0 = [part for part in p.parts if part[0] == "rows"][1]
    assert k0[1] == 576 // 3 * 2 and k0[3] == 400  # f16 K row: n_embd_k_gqa (3 heads x 64) x 2 bytes
    last = p.parts[-1]
    end = last[3] + last[1] * last[2] * last[4] if last[0] == "vtrans" else last[2] + last[1] * last[3]
    assert end == len(data)
    assert struct.unpack_from("<I", data, 0)[0] == L.IO_MAGIC


@pytest.mark.parametrize("kind", ["trans", "rows"])
def test_prefix_blocks_are_byte_identical_across_sessions(real_states, kind: str) -> None:
    _, a = real_states.get("a", kind)
    _, b = real_states.get("b", kind)
    pa, pb = L.parse(a), L.parse(b)
    ca, cb = L.cut(a, pa, 100, 1 << 20), L.cut(b, pb, 100, 1 << 20)
    data = [(xa, xb) for xa, xb in zip(ca, cb) if isinstance(xa, list)]
    assert len(data) == 61  # the per-cell meta, 30 x K, 30 x V
    for xa, xb in data:
        assert xa[:3] == xb[:3]  # tokens 0..299 are shared
    for xa, xb in data[1:]:  # the tails' meta (positions) is alike; their K and V differ
        assert xa[3] != xb[3]


def test_unparseable_bytes_become_a_blob() -> None:
    p = L.parse(b"\x00" * 1000)
    assert p.kind == "blob" and p.why and p.parts == [("blob", 0, 1000)]
    _, data = (None, b"")
    assert L.parse(data).kind == "blob"


def test_truncated_real_state_is_not_parsed_as_kv(real_states) -> None:
    _, a = real_states.get("a", "trans")
    assert L.parse(a[:-1]).kind == "blob" and L.parse(a + b"x").kind == "blob"

"""The ggml relay's tensor checks, sans-IO: rpc_tensor bytes and a buffer table in, a refusal or not out.

The type table is ggml's for F32 (block 1, 4 bytes) and Q4_0 (block 32, 18 bytes); the integration
tests (tests/integration/test_rpc_security.py) run the same checks against llama.cpp's real server."""

from __future__ import annotations

import struct

import pytest

from hydrad.engine.rpc import ggml_relay as G

SIZES = [(1, 4), (1, 2), (32, 18)] + [(1, 1)] * (G.GGML_TYPE_COUNT - 3)
BASE, SIZE, PTR = 0x7000_0000, 4096, 0xABC0
BUFFERS = {PTR: (BASE, SIZE)}


def tensor(data: int = BASE, n: int = 16, typ: int = 0, buffer: int = PTR, op: int = 0, tid: int = 1,
           src: tuple[int, ...] = ()) -> bytes:
    tsize = 4 if typ == 0 else 18
    nb0 = tsize
    nb1 = tsize * n // (32 if typ == 2 else 1)
    srcs = list(src) + [0] * (10 - len(src))
    return G.TENSOR.pack(tid, typ, buffer, n, 1, 1, 1, nb0, nb1, nb1, nb1, op, *([0] * 16), 0, *srcs, 0, 0,
                         data, b"t", 0)


def test_extent_is_ggml_nbytes_and_must_fit_the_buffer() -> None:
    check = G.TensorCheck(SIZES)
    assert check.tensor(tensor(), 0, BUFFERS, need_buffer=True) == ((BASE, SIZE), BASE, 64)
    assert check.tensor(tensor(typ=2, n=64), 0, BUFFERS, need_buffer=True)[2] == 36  # two Q4_0 blocks
    check.tensor(tensor(data=BASE + SIZE - 64), 0, BUFFERS, need_buffer=True)  # flush with the end: fine
    for bad, why in ((tensor(data=BASE + SIZE - 60), "outside"), (tensor(data=BASE - 4), "outside"),
                     (tensor(buffer=0x1234), "did not allocate"), (tensor(typ=G.GGML_TYPE_COUNT), "type"),
                     (tensor(op=G.GGML_OP_COUNT), "op")):
        with pytest.raises(G.Refused, match=why):
            check.tensor(bad, 0, BUFFERS, need_buffer=True)
    with pytest.raises(G.Refused, match="without a buffer"):
        check.tensor(tensor(buffer=0, data=0), 0, BUFFERS, need_buffer=True)
    assert check.tensor(tensor(buffer=0, data=0), 0, BUFFERS, need_buffer=False)[0] is None
    with pytest.raises(G.Refused, match="data but no buffer"):
        check.tensor(tensor(buffer=0, data=BASE), 0, BUFFERS, need_buffer=False)


def test_regions_as_the_server_checks_them() -> None:
    G.TensorCheck.region((BASE, SIZE), BASE, 0, SIZE)
    for offset, n in ((SIZE, 0), (0, SIZE + 1), (SIZE - 8, 16), (1 << 63, 1)):
        with pytest.raises(G.Refused):
            G.TensorCheck.region((BASE, SIZE), BASE, offset, n)


def graph(nodes: list[int], tensors: list[bytes], device: int = 0) -> bytes:
    return struct.pack(f"<II{len(nodes)}QI", device, len(nodes), *nodes, len(tensors)) + b"".join(tensors)


def test_graphs_must_be_closed_and_without_repeats() -> None:
    check = G.TensorCheck(SIZES)
    good = graph([2], [tensor(tid=1), tensor(tid=2, data=BASE + 64, src=(1,))])
    assert check.graph(good, 1, BUFFERS) == 0
    cases = {
        "not among its tensors": graph([3], [tensor(tid=1)]),
        "source 9": graph([1], [tensor(tid=1, src=(9,))]),
        "appears twice": graph([1, 1], [tensor(tid=1)]),
        "device 1": graph([1], [tensor(tid=1)], device=1),
        "does not match": graph([1], [tensor(tid=1)]) + b"\0",
    }
    for why, payload in cases.items():
        with pytest.raises(G.Refused, match=why):
            check.graph(payload, 1, BUFFERS)
    with pytest.raises(G.Refused, match="nodes"):
        check.graph(struct.pack("<II", 0, G.MAX_GRAPH_ITEMS + 1), 1, BUFFERS)


def test_a_graph_may_name_tensors_held_by_no_buffer_here_but_not_stray_data() -> None:
    """As the stock server: buffer 0 with data 0 (an expert split's graphs have such tensors) passes;
    a data pointer without a buffer of this peer's is refused."""
    check = G.TensorCheck(SIZES)
    ok = graph([2], [tensor(tid=1, buffer=0, data=0), tensor(tid=2, data=BASE + 64, src=(1,))])
    assert check.graph(ok, 1, BUFFERS) == 0
    stray = graph([2], [tensor(tid=1, buffer=0, data=BASE), tensor(tid=2, data=BASE + 64, src=(1,))])
    with pytest.raises(G.Refused, match="data but no buffer"):
        check.graph(stray, 1, BUFFERS)

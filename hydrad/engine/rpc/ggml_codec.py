"""ggml-RPC's wire format as the relay (``ggml_relay``) checks it: command numbers, fixed request
and answer sizes, the packed ``rpc_tensor``, and :class:`TensorCheck`, which validates a tensor's
type, extent and read/write region against the buffers a peer owns, and a compute graph's
structure. Pure parsing; no socket but the exact-read helper.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

# rpc_cmd of the bundled llama.cpp (ggml-rpc.cpp); protocol 7.x
ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR, \
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR, GET_ALLOC_SIZE, \
    HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR = range(18)
CMD_NAMES = ["ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER", "BUFFER_CLEAR",
             "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
             "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR"]
PROTO_MAJOR = 7
GGML_TYPE_COUNT = 43  # ggml.h of the bundled build; the RPC header pins GGML_OP_COUNT for protocol 7.0
GGML_OP_COUNT = 101
MAX_SRC = 10
CAPS_SIZE = 24

# rpc_tensor, packed: id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src, view_offs,
# data, name[64], use_count
TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
assert TENSOR.size == 296
T = TENSOR.size
EXACT_LIMIT = 1 << 62  # sizes and pointers past this are left to the exact (Python integer) check
HEAD = struct.Struct("<BQ")  # a command: cmd, payload size
SIZE = struct.Struct("<Q")  # an answer's payload size

# Fixed request sizes (a command with another size is refused, as the server would) and answer sizes.
REQUEST_SIZE = {ALLOC_BUFFER: 12, GET_ALIGNMENT: 4, GET_MAX_SIZE: 4, BUFFER_GET_BASE: 8, FREE_BUFFER: 8,
                BUFFER_CLEAR: 9, SET_TENSOR_HASH: T + 16, GET_TENSOR: T + 16, COPY_TENSOR: 2 * T,
                GET_DEVICE_MEMORY: 4, INIT_TENSOR: T, GET_ALLOC_SIZE: 4 + T * (1 + MAX_SRC), DEVICE_COUNT: 0,
                GRAPH_RECOMPUTE: 4, MEMSET_TENSOR: T + 17}
ANSWER_SIZE = {ALLOC_BUFFER: 16, GET_ALIGNMENT: 8, GET_MAX_SIZE: 8, BUFFER_GET_BASE: 8, SET_TENSOR_HASH: 1,
               COPY_TENSOR: 1, GET_DEVICE_MEMORY: 16, GET_ALLOC_SIZE: 8, DEVICE_COUNT: 4}
SET_TENSOR_HEAD = T + 9  # rpc_tensor | cache flag u8 | offset u64 | data
MAX_GRAPH_ITEMS = 1 << 18  # nodes or tensors in one graph: llama.cpp's graphs stay far below
MAX_GRAPH_BYTES = 8 + 8 * MAX_GRAPH_ITEMS + 4 + T * MAX_GRAPH_ITEMS
BUFFERED = 64 << 20  # payloads up to this size are read whole before the upstream is taken
CHUNK = 1 << 20


class Refused(Exception):
    """The peer sent something the relay will not forward; the peer's connection is closed."""


def _recv_exact(sock: socket.socket, n: int, into: bytearray | None = None) -> bytearray:
    buf = into if into is not None else bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return buf


class TensorCheck:
    """The checks llama.cpp's server makes (or asserts) on an rpc_tensor, done first, against the buffers
    of the peer that sent it. Sans-IO: bytes and a buffer table in, a reason to refuse (or None) out."""

    def __init__(self, sizes: list[tuple[int, int]]) -> None:
        # numpy only now, never at import: the engine loads libllama before numpy (llama.preload_native)
        import numpy as np

        self.np = np
        self.sizes = sizes  # (block size, type size) per ggml type
        self._blck = np.array([b for b, _ in sizes], dtype=np.uint64)
        self._tsize = np.array([t for _, t in sizes], dtype=np.uint64)
        # the fields of rpc_tensor a graph's check reads, at their offsets in the packed struct
        self._fields = np.dtype({"names": ["id", "type", "buffer", "ne", "nb", "op", "src", "view_src", "data"],
                                 "formats": ["<u8", "<u4", "<u8", ("<u4", (4,)), ("<u4", (4,)), "<u4",
                                             ("<u8", (MAX_SRC,)), "<u8", "<u8"],
                                 "offsets": [0, 8, 12, 20, 36, 52, 124, 204, 220], "itemsize": T})

    def nbytes(self, typ: int, ne: tuple[int, ...], nb: tuple[int, ...]) -> int:
        """ggml_nbytes, in exact integers."""
        if any(n == 0 for n in ne):
            return 0
        blck, tsize = self.sizes[typ]
        if blck == 1:
            return tsize + sum((ne[i] - 1) * nb[i] for i in range(4))
        return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))

    def tensor(self, raw: bytes | bytearray | memoryview, off: int, buffers: dict[int, tuple[int, int]],
               need_buffer: bool) -> tuple[tuple[int, int] | None, int, int]:
        """Check one rpc_tensor at ``off``; returns (its buffer's (base, size) or None, data, nbytes)."""
        f = TENSOR.unpack_from(raw, off)
        typ, buf, ne, nb, op, data = f[1], f[2], f[3:7], f[7:11], f[11], f[41]
        if typ >= GGML_TYPE_COUNT or self.sizes[typ][0] == 0:
            raise Refused(f"tensor of unknown type {typ}")
        if op >= GGML_OP_COUNT:
            raise Refused(f"tensor with unknown op {op}")
        if buf == 0:
            if need_buffer:
                raise Refused("tensor without a buffer")
            if data != 0:
                raise Refused("tensor with data but no buffer")
            return None, 0, 0
        region = buffers.get(buf)
        if region is None:
            raise Refused(f"tensor in buffer 0x{buf:x}, which this peer did not allocate")
        base, size = region
        n = self.nbytes(typ, ne, nb)
        if data < base or data + n > base + size:
            raise Refused(f"tensor extent [0x{data:x}, +{n}) is outside its buffer [0x{base:x}, +{size})")
        return region, data, n

    @staticmethod
    def region(region: tuple[int, int], data: int, offset: int, size: int) -> None:
        """The server's own check of a read/write region (which closes the connection when it fails)."""
        p0, p1 = region[0], region[0] + region[1]
        if data + offset < p0 or data + offset >= p1 or size > p1 - data - offset:
            raise Refused(f"region offset {offset} size {size} is outside the tensor's buffer")

    def graph(self, payload: bytes, n_devices: int, buffers: dict[int, tuple[int, int]]) -> int:
        """Check a GRAPH_COMPUTE payload; returns its device. A head on a GPU sends a new graph with
        almost every token (its KV views grow), hundreds of tensors each: they are checked as arrays
        (:meth:`graph_arrays`), and only a graph that fails there is gone through tensor by tensor
        (:meth:`graph_exact`), which says what is wrong with it."""
        device = self.graph_arrays(payload, n_devices, buffers)
        return device if device is not None else self.graph_exact(payload, n_devices, buffers)

    def graph_arrays(self, payload: bytes, n_devices: int, buffers: dict[int, tuple[int, int]]) -> int | None:
        """The checks of :meth:`graph_exact` on all tensors at once: the device when every one passes,
        None when any fails or a value is too large to be sure of in 64-bit arithmetic."""
        np: Any = self.np
        if len(payload) < 8:
            return None
        device, n_nodes = struct.unpack_from("<II", payload, 0)
        if device >= n_devices or n_nodes > MAX_GRAPH_ITEMS:
            return None
        off = 8 + 8 * n_nodes
        if len(payload) < off + 4:
            return None
        (n_tensors,) = struct.unpack_from("<I", payload, off)
        off += 4
        if n_tensors > MAX_GRAPH_ITEMS or len(payload) != off + T * n_tensors:
            return None
        t = np.frombuffer(payload, dtype=self._fields, count=n_tensors, offset=off)
        if n_tensors:
            typ = t["type"]
            if int(typ.max()) >= GGML_TYPE_COUNT or int(t["op"].max()) >= GGML_OP_COUNT:
                return None
            blck = self._blck[typ]
            if not blck.all():
                return None
            buf, data = t["buffer"], t["data"]
            held = buf != 0
            if data[~held].any():  # data without a buffer
                return None
            if held.any():
                owners, which = np.unique(buf[held], return_inverse=True)
                regions = [buffers.get(int(b)) for b in owners]
                if any(r is None for r in regions):
                    return None
                base = np.array([r[0] for r in regions], dtype=np.uint64)[which]  # type: ignore[index]
                size = np.array([r[1] for r in regions], dtype=np.uint64)[which]  # type: ignore[index]
                ne, nb, d = t["ne"][held].astype(np.uint64), t["nb"][held].astype(np.uint64), data[held]
                b, tsize = blck[held], self._tsize[typ[held]]
                empty = (ne == 0).any(axis=1)
                less = np.where(ne > 0, ne - 1, 0)
                if float((less.astype(np.float64) * nb).sum(axis=1).max() + (ne[:, 0].astype(np.float64) * nb[:, 0]).max()) \
                        >= EXACT_LIMIT or int(d.max()) >= EXACT_LIMIT or int((base + size).max()) >= EXACT_LIMIT:
                    return None
                tail = (less[:, 1:] * nb[:, 1:]).sum(axis=1)
                n = np.where(b == 1, tsize + less[:, 0] * nb[:, 0] + tail, ne[:, 0] * nb[:, 0] // b + tail)
                n = np.where(empty, 0, n)
                if not ((d >= base) & (d + n <= base + size)).all():
                    return None
        ids = t["id"]
        nodes = np.frombuffer(payload, dtype="<u8", count=n_nodes, offset=8)
        nodes = nodes[nodes != 0]
        if nodes.size and (not np.isin(nodes, ids).all() or np.unique(nodes).size != nodes.size):
            return None
        refs = np.concatenate([t["src"].ravel(), t["view_src"]])
        refs = refs[refs != 0]
        if refs.size and not np.isin(refs, ids).all():
            return None
        return device

    def graph_exact(self, payload: bytes, n_devices: int, buffers: dict[int, tuple[int, int]]) -> int:
        """The graph checked tensor by tensor, with Python's exact integers: its device, or Refused
        saying what is wrong."""
        if len(payload) < 8:
            raise Refused("graph shorter than its header")
        device, n_nodes = struct.unpack_from("<II", payload, 0)
        if device >= n_devices:
            raise Refused(f"graph for device {device}; this engine serves {n_devices}")
        if n_nodes > MAX_GRAPH_ITEMS:
            raise Refused(f"graph of {n_nodes} nodes")
        off = 8 + 8 * n_nodes
        if len(payload) < off + 4:
            raise Refused("graph shorter than its node list")
        nodes = struct.unpack_from(f"<{n_nodes}Q", payload, 8)
        (n_tensors,) = struct.unpack_from("<I", payload, off)
        off += 4
        if n_tensors > MAX_GRAPH_ITEMS or len(payload) != off + T * n_tensors:
            raise Refused("graph size does not match its tensor count")
        ids: dict[int, int] = {}
        refs: list[int] = []
        for i in range(n_tensors):
            at = off + i * T
            # a graph may name tensors held by none of this server's buffers (buffer 0, data 0): the stock
            # server accepts them, and an expert split's graphs have them; data without a buffer is refused
            self.tensor(payload, at, buffers, need_buffer=False)
            f = TENSOR.unpack_from(payload, at)
            ids.setdefault(f[0], at)
            refs.extend(x for x in f[29:40] if x)  # src[10] and view_src
        seen: set[int] = set()
        for node in nodes:
            if node == 0:
                continue
            if node not in ids:
                raise Refused(f"graph node {node} is not among its tensors")
            if node in seen:
                raise Refused(f"graph node {node} appears twice")
            seen.add(node)
        for ref in refs:
            if ref not in ids:
                raise Refused(f"graph source {ref} is not among its tensors")
        return device

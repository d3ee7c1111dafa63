"""Checks a COMBINE peer from Python before llama.cpp's ggml-RPC client is let near it.

llama.cpp's client aborts the whole process when it cannot connect to an endpoint, when the
handshake fails, or when the server speaks another protocol version. A head that simply
called ``ggml_backend_rpc_add_server`` on a peer that is down would die instead of failing
one load. So the head first does the same handshake itself (HELLO, DEVICE_COUNT,
GET_DEVICE_MEMORY) on a connection of its own, closes it, and only then lets llama.cpp
connect. A peer that dies between the probe and llama.cpp's connect still aborts the head (a
window of milliseconds; systemd's ``Restart=`` covers it, docs/engine.md).

The same answers give the head what it reports about its pair: the peer's protocol version
and each remote device's memory.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from hydrad.common.netaccess import split_endpoint
from hydrad.engine.rpc.ggml_codec import (
    CAPS_SIZE, DEVICE_COUNT, GET_DEVICE_MEMORY, HEAD, HELLO, PROTO_MAJOR, SIZE, _recv_exact,
)


class PeerUnavailable(ConnectionError):
    """The peer cannot serve a split: unreachable, not ggml-RPC, another protocol, or no device."""


@dataclass(frozen=True)
class PeerDevice:
    index: int
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class PeerInfo:
    endpoint: str
    version: str
    devices: tuple[PeerDevice, ...]

    def public(self) -> dict[str, object]:
        return {"endpoint": self.endpoint, "version": self.version,
                "devices": [{"index": d.index, "memory_free": d.memory_free, "memory_total": d.memory_total}
                            for d in self.devices]}


def _answer(sock: socket.socket, want: int) -> bytes:
    (n,) = SIZE.unpack(_recv_exact(sock, 8))
    if n != want:
        raise PeerUnavailable(f"answer of {n} bytes where {want} were due (not a ggml-RPC server?)")
    return bytes(_recv_exact(sock, n))


def probe(endpoint: str, timeout: float = 3.0) -> PeerInfo:
    """Handshake with the ggml-RPC server at ``endpoint`` (a peer's merged port, or a stock
    ``rpc-server``) and list its devices; raises :class:`PeerUnavailable` with the reason."""
    try:
        addr = split_endpoint(endpoint)
    except ValueError as exc:
        raise PeerUnavailable(str(exc)) from None
    try:
        with socket.create_connection(addr, timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(HEAD.pack(HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
            hello = _answer(s, 4 + CAPS_SIZE)
            if hello[0] != PROTO_MAJOR:
                raise PeerUnavailable(f"peer speaks ggml-RPC {hello[0]}.{hello[1]}; this build speaks {PROTO_MAJOR}.x")
            s.sendall(HEAD.pack(DEVICE_COUNT, 0))
            (count,) = struct.unpack("<I", _answer(s, 4))
            if count == 0:
                raise PeerUnavailable("peer serves no device")
            devices = []
            for i in range(min(count, 16)):
                s.sendall(HEAD.pack(GET_DEVICE_MEMORY, 4) + struct.pack("<I", i))
                free, total = struct.unpack("<QQ", _answer(s, 16))
                devices.append(PeerDevice(i, free, total))
    except PeerUnavailable as exc:
        raise PeerUnavailable(f"peer {endpoint}: {exc}") from None
    except (OSError, ConnectionError) as exc:
        raise PeerUnavailable(f"peer {endpoint} unreachable: {exc or 'timeout'}") from None
    return PeerInfo(endpoint, f"{hello[0]}.{hello[1]}.{hello[2]}", tuple(devices))

"""Client of the merged RPC port's Hydra ops, for hydractl, tests, peers and the coordinator.

Blocking sockets and the same sans-IO decoder as the server. ``migrate`` streams a slot's KV
state from engine A to engine B chunk by chunk, never holding more than one chunk in flight
beyond what the sockets buffer.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any, Iterator

from hydrad.wire import protocol as P
from hydrad.wire.kvstream import chunked


class RpcError(Exception):
    """The engine answered with an error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} [{code}]")
        self.status = status
        self.code = code
        self.message = message


def parse_address(addr: str, default_port: int = 9503) -> tuple[str, int]:
    addr = addr.removeprefix("tcp://")
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, default_port
    return host, int(port)


@dataclass
class StateStream:
    meta: dict[str, Any]
    chunks: Iterator[bytes]


class RpcClient:
    def __init__(self, address: str | tuple[str, int], token: str | None = None, timeout: float = 60.0,
                 hello: bool = True) -> None:
        host, port = parse_address(address) if isinstance(address, str) else address
        self.address = (host, port)
        self.sock = socket.create_connection(self.address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = P.FrameDecoder(P.RESPONSE_CODES)
        self._frames: list[P.Frame] = []
        self._buf = bytearray(1 << 20)
        self.server: dict[str, Any] = {}
        if hello or token:
            self.server = self.call(P.Op.HELLO, {"version": P.PROTOCOL_VERSION, "client": "hydrad.rpc", "token": token}
                                    if token else {"version": P.PROTOCOL_VERSION, "client": "hydrad.rpc"})

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RpcClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- framing ------------------------------------------------------------------------

    def send(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)

    def recv(self) -> P.Frame:
        while not self._frames:
            n = self.sock.recv_into(self._buf)
            if n == 0:
                try:
                    self.decoder.eof()
                except P.ProtocolError as exc:
                    # the engine went away inside a frame (killed mid-stream): a lost connection, which every
                    # caller handles (OSError), not a protocol violation that would escape as a crash
                    raise ConnectionError(f"engine at {self.address[0]}:{self.address[1]} closed the connection "
                                          f"inside a frame ({exc})") from None
                raise ConnectionError(f"engine at {self.address[0]}:{self.address[1]} closed the connection")
            self._frames.extend(self.decoder.feed(memoryview(self._buf)[:n]))
        return self._frames.pop(0)

    @staticmethod
    def _raise_if_error(frame: P.Frame) -> None:
        if frame.code >= P.Status.ERROR:
            try:
                body = frame.json()
            except P.ProtocolError:
                body = {}
            raise RpcError(frame.code, str(body.get("code", "error")), str(body.get("message", "error")))

    def call(self, op: int, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send(P.encode_json(op, payload or {}))
        frame = self.recv()
        self._raise_if_error(frame)
        return frame.json()

    # ----- ops ----------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return self.call(P.Op.INFO)

    def configure(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.call(P.Op.ENGINE_CONFIGURE, payload)

    def state_get(self, slot: int) -> StateStream:
        """Start STATE_GET; iterate ``chunks`` to the end before sending anything else on this client."""
        self.send(P.encode_json(P.Op.STATE_GET, {"slot": slot}))
        first = self.recv()
        self._raise_if_error(first)
        if first.code != P.Status.STATE_META:
            raise P.ProtocolError(f"expected STATE_META, got 0x{first.code:02x}")
        meta = first.json()

        def chunks() -> Iterator[bytes]:
            while True:
                f = self.recv()
                self._raise_if_error(f)
                if f.code == P.Status.STATE_DATA:
                    yield f.payload
                elif f.code == P.Status.STATE_END:
                    self.last_end = f.json()
                    return
                else:
                    raise P.ProtocolError(f"unexpected frame 0x{f.code:02x} in a state stream")

        return StateStream(meta, chunks())

    def state_get_bytes(self, slot: int) -> tuple[dict[str, Any], bytes]:
        st = self.state_get(slot)
        return st.meta, b"".join(st.chunks)

    def state_put(self, slot: int, meta: dict[str, Any], chunks: Iterator[bytes] | bytes,
                  chunk_size: int | None = None) -> dict[str, Any]:
        """Restore a slot. Data goes only after the engine said CONTINUE (a refused state costs no upload)."""
        self.send(P.encode_json(P.Op.STATE_PUT, {"slot": slot, "meta": meta}))
        frame = self.recv()
        self._raise_if_error(frame)
        if frame.code != P.Status.CONTINUE:
            raise P.ProtocolError(f"expected CONTINUE, got 0x{frame.code:02x}")
        if isinstance(chunks, (bytes, bytearray, memoryview)):
            size = chunk_size or int(self.server.get("chunk_size", 2 << 20))
            for piece in chunked(meta, chunks, size, data_code=P.Op.STATE_DATA, end_code=P.Op.STATE_END, meta_code=None):
                self.send(piece)
        else:
            import xxhash

            h = xxhash.xxh3_128()
            total = 0
            for piece in chunks:
                h.update(piece)
                total += len(piece)
                self.send(P.HEADER.pack(P.Op.STATE_DATA, len(piece)))
                self.send(piece)
            self.send(P.encode_json(P.Op.STATE_END, {"bytes": total, "xxh3_128": h.hexdigest()}))
        frame = self.recv()
        self._raise_if_error(frame)
        return frame.json()


def migrate(src: str, dst: str, slot: int, dst_slot: int | None = None, token: str | None = None) -> dict[str, Any]:
    """Move a slot's KV state from engine ``src`` to engine ``dst`` directly (streamed, no disk)."""
    t0 = time.monotonic()
    with RpcClient(src, token) as a, RpcClient(dst, token) as b:
        st = a.state_get(slot)
        result = b.state_put(slot if dst_slot is None else dst_slot, st.meta, st.chunks)
    result["bytes"] = st.meta["bytes"]
    result["n_tokens"] = st.meta["n_tokens"]
    result["total_seconds"] = round(time.monotonic() - t0, 6)
    return result

"""ggml-RPC through the merged port: a relay that checks every command before llama.cpp sees it.

llama.cpp's ggml RPC server trusts its client: a tensor whose data lies outside its buffer trips
a ``GGML_ASSERT`` and aborts the whole engine, a command it refuses closes the connection, and it
serves one client at a time, so one idle client blocks every other. It also only listens on TCP,
where any local user could reach it past ``control_allow_from``. So the relay:

* holds the server's one client connection for the life of the engine (the *upstream*) and seals
  the server's listening socket right after (``ggml.seal_server``): nothing else can reach it;
* answers each peer's HELLO itself and then multiplexes the peers' commands onto the upstream,
  one command at a time, so an idle peer holds nothing and peers never wait for each other's
  idle time, only for a command in flight;
* parses the ggml-RPC framing (``cmd:u8 | size:u64 | payload``; answers ``size:u64 | payload``)
  and refuses, by closing that peer alone, unknown commands, wrong sizes, devices that do not
  exist, buffers the peer does not own, and tensors whose extent or read/write region falls
  outside their buffer — the cheap checks that stand between a bad peer and an abort;
* keeps each peer's buffers its own (the server sees one client, so the relay does what the
  server does per connection: buffers are freed when their peer goes, a graph is recomputed only
  for the peer that sent it).

A peer is refused the way the stock server refuses: its connection is closed (llama.cpp on the
other side then aborts, as it would against the stock server). What cannot be checked cheaply is
the meaning of a compute graph (op parameters, shapes an op asserts on): ggml-RPC compute is code
running on this engine's device, which is why only ``control_allow_from`` may connect at all.

The wire format and the per-command checks are in ``ggml_codec``; this module is the relay loop.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hydrad.common.cpus import usable_cpus
from hydrad.common.logs import log_event
from hydrad.common.netaccess import address_allowed
from hydrad.engine.rpc.ggml_codec import (  # noqa: F401 (the wire format; re-exported for the tests)
    ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR,
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR, GET_ALLOC_SIZE,
    HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR, CMD_NAMES, PROTO_MAJOR, GGML_TYPE_COUNT,
    GGML_OP_COUNT, MAX_SRC, CAPS_SIZE, TENSOR, T, HEAD, SIZE, REQUEST_SIZE, ANSWER_SIZE, SET_TENSOR_HEAD,
    MAX_GRAPH_ITEMS, MAX_GRAPH_BYTES, BUFFERED, CHUNK, Refused, _recv_exact, TensorCheck,
)
from hydrad.engine.rpc.ggml_direct import DirectLine
from hydrad.engine.rpc.peer_reader import PeerReader
from hydrad.engine.settings import EngineSettings

log = logging.getLogger("hydrad.rpc.ggml")
MAX_CHECKED_GRAPHS = 128  # a head sends one graph per split per token; comparing against a miss stops at once
QUEUED = 64 << 10  # a command up to this size waits in the upstream queue; larger ones are sent at once
QUEUE_LIMIT = 256 << 10  # the queue is sent when it holds this much


class UpstreamLost(Exception):
    """The connection to llama.cpp's server broke; ggml-RPC is unavailable until the engine restarts."""


class _Peer:
    _ids = itertools.count(1)

    def __init__(self, conn: socket.socket, addr: str) -> None:
        self.id = next(self._ids)
        self.conn = conn
        self.addr = addr
        self.buffers: dict[int, tuple[int, int]] = {}  # remote_ptr -> (base, size), this peer's only
        self.graphs: dict[int, bytes] = {}  # device -> this peer's last GRAPH_COMPUTE payload
        # graph payloads already checked against the current buffers, with their device: a head resends the
        # same few graphs every token (one per split), so each is parsed once, not once per token. Found by
        # comparing bytes (memcmp, stops at the first difference), not by hashing them: a graph is tens of
        # kilobytes and Python's bytes hash costs more than the comparisons
        self.checked: list[tuple[bytes, int]] = []
        self.graph_serial: dict[int, int] = {}
        self.commands = 0
        self.reader: PeerReader | None = None


class GgmlRelay:
    def __init__(self, settings: EngineSettings, endpoint: tuple[str, int]) -> None:
        self.settings = settings
        self.rpc = settings.rpc
        self.endpoint = endpoint
        self.cache_dir = settings.rpc.cache_dir or Path(
            os.environ.get("CACHE_DIRECTORY") or Path.home() / ".cache" / "hydra") / f"rpc-{settings.name}"
        self.ready = threading.Event()
        self.broken: str | None = None
        self.hello_answer = b""
        self.n_devices = 0
        self.check: TensorCheck | None = None
        self._up: socket.socket | None = None
        # one command at a time on the upstream; reentrant because a large upload, streamed with it held,
        # flushes the queue before each wait for the peer's next piece
        self._lock = threading.RLock()
        # commands without an answer, in order, not yet sent: the server gets a token's inputs and graph in
        # one send, when the relay is about to wait (for a peer's bytes or for an answer), not one per command
        self._out: list[bytes] = []
        self._out_n = 0
        self._peers: dict[int, _Peer] = {}
        self._peers_lock = threading.Lock()
        self._current_graph: dict[int, tuple[int, int]] = {}  # device -> (peer id, serial) the server holds
        self._serial = itertools.count(1)
        # weight_bytes: tensor data the peers uploaded (SET_TENSOR); cache_hits/misses: tensors offered by
        # hash (SET_TENSOR_HASH) that the tensor cache held or lacked, i.e. uploads saved or still due
        self.stats = {"peers_served": 0, "refused": 0, "commands": 0, "sealed_cut": 0, "weight_bytes": 0,
                      "cache_hits": 0, "cache_hit_bytes": 0, "cache_misses": 0,
                      "graphs_recomputed": 0}
        self._by_command = [0] * len(CMD_NAMES)  # what the peers send, per command: where a token's round trips go
        # trusted peers (rpc.ggml_direct_from) skip the relay: handed to a server instance of their own
        self.direct = DirectLine(self.cache_dir, self.rpc.ggml_threads or usable_cpus(),
                                 self.rpc.ggml_io_timeout_s) if self.rpc.ggml_direct_from else None

    # ----- the upstream: connect, seal, lose --------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._connect, name="hydrad-ggml-seal", daemon=True).start()
        if self.direct is not None:
            self.direct.start()

    def _connect(self) -> None:
        deadline = time.monotonic() + 10.0  # the in-process server may still be binding right after boot
        up = None
        while up is None:
            try:
                up = socket.create_connection(self.endpoint, timeout=5)
            except OSError as exc:
                if time.monotonic() > deadline:
                    self._fail(f"ggml RPC server unreachable: {exc}")
                    return
                time.sleep(0.05)
        try:
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up.settimeout(5)  # the server answers HELLO at once unless it is serving someone else
            up.sendall(HEAD.pack(HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
            (n,) = SIZE.unpack(_recv_exact(up, 8))
            if n != 4 + CAPS_SIZE:
                raise OSError(f"unexpected HELLO answer of {n} bytes")
            answer = bytes(_recv_exact(up, n))
        except OSError as exc:
            from hydrad.engine import ggml

            # someone else got served first: cut everything on that port and keep ggml-RPC off
            cut = ggml.seal_server(self.endpoint, ("", -1))
            up.close()
            self._fail(f"ggml RPC server did not answer the relay's HELLO ({exc}); {cut} other connection(s) cut")
            return
        from hydrad.engine import ggml

        cut = ggml.seal_server(self.endpoint, up.getsockname()[:2])
        self.stats["sealed_cut"] = cut
        if cut:
            log_event(log, logging.WARNING, "foreign connections to the ggml RPC server cut", count=cut)
        if answer[0] != PROTO_MAJOR:
            up.close()
            self._fail(f"ggml RPC server speaks protocol {answer[0]}.{answer[1]}; this relay checks {PROTO_MAJOR}.x")
            return
        try:
            up.sendall(HEAD.pack(DEVICE_COUNT, 0))
            (n,) = SIZE.unpack(_recv_exact(up, 8))
            (self.n_devices,) = struct.unpack("<I", _recv_exact(up, n))
            self.check = TensorCheck(ggml.type_sizes(GGML_TYPE_COUNT))
        except Exception as exc:
            up.close()
            self._fail(f"ggml RPC relay setup failed: {exc}")
            return
        up.settimeout(None)
        self.hello_answer = SIZE.pack(len(answer)) + answer[:4] + bytes(CAPS_SIZE)  # TCP only, never upgraded
        self._up = up
        log_event(log, logging.INFO, "ggml RPC server sealed behind the merged port", devices=self.n_devices,
                  version=f"{answer[0]}.{answer[1]}.{answer[2]}")
        self.ready.set()

    def _fail(self, reason: str) -> None:
        self.broken = reason
        log_event(log, logging.ERROR, "ggml-RPC unavailable", reason=reason)
        self.ready.set()
        with self._peers_lock:
            peers = list(self._peers.values())
        for p in peers:
            try:
                p.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _lost(self, exc: BaseException) -> UpstreamLost:
        if self.broken is None:
            self._fail(f"connection to the ggml RPC server lost ({exc}); restart the engine to serve peers again")
        return UpstreamLost(str(exc))

    def close(self) -> None:
        if self._up is not None:
            try:
                self._up.close()
            except OSError:
                pass

    # ----- one peer -----------------------------------------------------------------------------

    def serve(self, conn: socket.socket, addr: str, deadline: float, identified: Callable[[], object]) -> None:
        """Serve one peer connection (first byte already seen to be HELLO) until it ends or is refused."""
        if not self.ready.wait(max(0.0, deadline - time.monotonic())) or self.broken is not None:
            log_event(log, logging.WARNING, "ggml-RPC refused", peer=addr, reason=self.broken or "relay not ready")
            return
        with self._peers_lock:
            if len(self._peers) >= self.rpc.max_ggml_connections:
                log_event(log, logging.WARNING, "ggml-RPC refused", peer=addr,
                          reason=f"more than {self.rpc.max_ggml_connections} ggml-RPC peers")
                return
            peer = _Peer(conn, addr)
            self._peers[peer.id] = peer
        try:
            try:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                head = _recv_exact(conn, 9)
                cmd, size = HEAD.unpack(head)
                if cmd != HELLO or size != CAPS_SIZE:
                    raise Refused("a ggml-RPC connection starts with HELLO")
                _recv_exact(conn, CAPS_SIZE)
                conn.settimeout(self.rpc.ggml_io_timeout_s)
                conn.sendall(self.hello_answer)
            except (OSError, ConnectionError) as exc:
                log_event(log, logging.INFO, "ggml-RPC peer gone before HELLO", peer=addr, error=str(exc) or "timeout")
                return
            identified()
            if (self.direct is not None and address_allowed(addr, self.rpc.ggml_direct_from)
                    and self.direct.take(conn, addr)):
                return
            # blocking reads with a kernel timeout: no poll() before each recv and no mode switch per
            # command (a timeout set with settimeout costs both), which the per-token round trips feel
            conn.settimeout(None)
            limit = min(self.rpc.ggml_io_timeout_s, self.rpc.ggml_idle_timeout_s)
            tv = struct.pack("ll", int(limit), int((limit % 1) * 1e6))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self.stats["peers_served"] += 1
            log_event(log, logging.INFO, "ggml-RPC connection", peer=addr)
            peer.reader = PeerReader(conn, self._flush_before_wait)
            self._loop(peer)
        except Refused as exc:
            self.stats["refused"] += 1
            log_event(log, logging.WARNING, "ggml-RPC peer refused; connection closed", peer=addr, reason=str(exc),
                      commands=peer.commands)
        except UpstreamLost:
            pass
        finally:
            self._release(peer)

    def _release(self, peer: _Peer) -> None:
        """What the stock server does when its client goes: free the client's buffers."""
        with self._peers_lock:
            self._peers.pop(peer.id, None)
        if self._up is None or self.broken is not None:
            return
        try:
            with self._lock:
                for ptr in list(peer.buffers):
                    self._queue_up(HEAD.pack(FREE_BUFFER, 8) + SIZE.pack(ptr))
                if peer.buffers:
                    self._current_graph.clear()  # the server drops every stored graph on a free
                self._flush_up()
        except UpstreamLost:
            return
        peer.buffers.clear()

    def _loop(self, peer: _Peer) -> None:
        """Commands until the peer goes. The socket's kernel timeout (``min(io, idle)``) bounds every
        read: inside a command a timeout is a stall; between commands a peer holding buffers (a head
        with weights here) may stay idle (keepalive finds it if it dies), one holding nothing is closed
        once idle for ``ggml_idle_timeout_s``."""
        r = peer.reader
        assert r is not None
        idle_since = time.monotonic()
        while True:
            if r.end - r.pos < 9:
                try:
                    r.need(9)
                except BlockingIOError:  # SO_RCVTIMEO: nothing arrived for a while
                    if r.buffered():
                        return  # stalled inside a command's header
                    if not peer.buffers and time.monotonic() - idle_since >= self.rpc.ggml_idle_timeout_s:
                        raise Refused(f"idle for {self.rpc.ggml_idle_timeout_s}s holding no buffer") from None
                    continue
                except (OSError, ConnectionError):
                    return
            cmd, size = HEAD.unpack_from(r.buf, r.pos)
            r.pos += 9
            peer.commands += 1
            self.stats["commands"] += 1
            if cmd < len(CMD_NAMES):
                self._by_command[cmd] += 1
            self._command(peer, cmd, size)
            idle_since = time.monotonic()

    def _read(self, peer: _Peer, n: int) -> bytes | bytearray:
        assert peer.reader is not None
        try:
            return peer.reader.take(n)
        except (OSError, ConnectionError) as exc:
            raise Refused(f"stalled or gone inside a command ({exc or 'timeout'})") from None

    def _command(self, peer: _Peer, cmd: int, size: int) -> None:
        if cmd >= len(CMD_NAMES) or cmd == HELLO:
            raise Refused(f"unknown or misplaced ggml-RPC command {cmd}")
        check = self.check
        assert check is not None
        if cmd == SET_TENSOR:
            self._set_tensor(peer, size)
            return
        if cmd == GRAPH_COMPUTE:
            if size > MAX_GRAPH_BYTES:
                raise Refused(f"graph of {size} bytes")
            payload = bytes(self._read(peer, size))
            hit = next(((known, d) for known, d in peer.checked if known == payload), None)
            if hit is None:
                device = check.graph(payload, self.n_devices, peer.buffers)
                peer.checked.insert(0, (payload, device))
                del peer.checked[MAX_CHECKED_GRAPHS:]
            else:
                payload, device = hit  # the checked copy: identity below says "the same graph as last time"
            again = peer.graphs.get(device) is payload
            peer.graphs[device] = payload
            with self._lock:
                if again and self._current_graph.get(device) == (peer.id, peer.graph_serial[device]):
                    # A head resends the very graph the server holds whenever llama.cpp rebuilt it (its own
                    # reuse test compares graph objects, not bytes): the server is told to recompute what it
                    # holds instead of reading and rebuilding the graph from hundreds of kilobytes again
                    self._send_up(HEAD.pack(GRAPH_RECOMPUTE, 4) + struct.pack("<I", device))
                    self.stats["graphs_recomputed"] += 1
                    return
                serial = next(self._serial)
                peer.graph_serial[device] = serial
                self._send_up(HEAD.pack(GRAPH_COMPUTE, size), payload)
                self._current_graph[device] = (peer.id, serial)
            return
        want = REQUEST_SIZE[cmd]
        if size != want:
            raise Refused(f"{CMD_NAMES[cmd]} of {size} bytes; it has {want}")
        payload = self._read(peer, size) if size else b""  # type: ignore[assignment]  # bytes | bytearray here
        answer_size = ANSWER_SIZE.get(cmd)
        if cmd in (ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, GET_DEVICE_MEMORY, GRAPH_RECOMPUTE, GET_ALLOC_SIZE):
            (device,) = struct.unpack_from("<I", payload, 0)
            if device >= self.n_devices:
                raise Refused(f"device {device}; this engine serves {self.n_devices}")
        if cmd in (BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR):
            (ptr,) = struct.unpack_from("<Q", payload, 0)
            if ptr not in peer.buffers:
                raise Refused(f"{CMD_NAMES[cmd]} of buffer 0x{ptr:x}, which this peer did not allocate")
        elif cmd == GET_ALLOC_SIZE:
            check.tensor(payload, 4, peer.buffers, need_buffer=False)
            for i in range(MAX_SRC):
                at = 4 + T * (1 + i)
                if struct.unpack_from("<Q", payload, at)[0] != 0:
                    check.tensor(payload, at, peer.buffers, need_buffer=False)
        elif cmd == INIT_TENSOR:
            check.tensor(payload, 0, peer.buffers, need_buffer=False)
        elif cmd == GET_TENSOR:
            region, data, _ = check.tensor(payload, 0, peer.buffers, need_buffer=True)
            offset, n = struct.unpack_from("<QQ", payload, T)
            check.region(region, data, offset, n)  # type: ignore[arg-type]
            answer_size = n
        elif cmd == SET_TENSOR_HASH:
            region, data, _ = check.tensor(payload, 0, peer.buffers, need_buffer=True)
            offset, digest = struct.unpack_from("<QQ", payload, T)
            try:
                cached = (self.cache_dir / f"{digest:016x}").stat().st_size
            except OSError:
                self.stats["cache_misses"] += 1
                self._answer(peer, b"\x00")  # not in the cache: the stock answer, without a round trip
                return
            check.region(region, data, offset, cached)  # type: ignore[arg-type]
            self.stats["cache_hits"] += 1
            self.stats["cache_hit_bytes"] += cached
        elif cmd == COPY_TENSOR:
            _, _, src_n = check.tensor(payload, 0, peer.buffers, need_buffer=True)
            dst, dst_data, _ = check.tensor(payload, T, peer.buffers, need_buffer=True)
            if dst_data + src_n > dst[0] + dst[1]:  # type: ignore[index]
                raise Refused("COPY_TENSOR writes past the end of the destination buffer")
        elif cmd == MEMSET_TENSOR:
            region, data, n = check.tensor(payload, 0, peer.buffers, need_buffer=True)
            offset, length = struct.unpack_from("<QQ", payload, T)
            if offset > n or length > n - offset:
                raise Refused("MEMSET_TENSOR region is outside the tensor")
            check.region(region, data, offset, length)  # type: ignore[arg-type]
        elif cmd == GRAPH_RECOMPUTE:
            (device,) = struct.unpack_from("<I", payload, 0)
            mine = peer.graphs.get(device)
            if mine is None:
                raise Refused("GRAPH_RECOMPUTE without a graph computed before")
            with self._lock:
                if self._current_graph.get(device) == (peer.id, peer.graph_serial[device]):
                    self._send_up(HEAD.pack(GRAPH_RECOMPUTE, 4), payload)
                else:  # the server holds someone else's graph (or none): send this peer's again
                    self._send_up(HEAD.pack(GRAPH_COMPUTE, len(mine)), mine)
                    self._current_graph[device] = (peer.id, peer.graph_serial[device])
            return
        with self._lock:
            self._send_up(HEAD.pack(cmd, size), payload)
            if cmd == FREE_BUFFER:
                (ptr,) = struct.unpack_from("<Q", payload, 0)
                del peer.buffers[ptr]
                peer.checked.clear()  # a graph naming the freed buffer must be checked again
                self._current_graph.clear()  # the server drops every stored graph on a free
                peer.graphs.clear()
                return
            if answer_size is None:
                return
            if answer_size > BUFFERED:
                self._stream_answer(peer, answer_size)
                return
            answer = self._recv_answer(answer_size)
            if cmd == ALLOC_BUFFER:
                ptr, got = struct.unpack_from("<QQ", answer, 8)
                if ptr:
                    self._send_up(HEAD.pack(BUFFER_GET_BASE, 8), SIZE.pack(ptr))
                    (base,) = struct.unpack_from("<Q", self._recv_answer(8), 8)
                    peer.buffers[ptr] = (base, got)
        self._answer_framed(peer, answer)

    def _send_up(self, head: bytes, payload: bytes | bytearray | memoryview = b"") -> None:
        """One command (or a large upload's next piece) to the server, lock held: a small one joins the
        queue, a large one goes at once, after the queue."""
        if len(head) + len(payload) <= QUEUED:
            self._queue_up(head + payload if payload else head)
            return
        self._flush_up()
        assert self._up is not None
        try:
            if head:
                _send_parts(self._up, head, payload)  # type: ignore[arg-type]
            else:
                self._up.sendall(payload)
        except OSError as exc:
            raise self._lost(exc) from None

    def _queue_up(self, data: bytes) -> None:
        self._out.append(data)
        self._out_n += len(data)
        if self._out_n >= QUEUE_LIMIT:
            self._flush_up()

    def _flush_up(self) -> None:
        """Send the queue (lock held)."""
        if not self._out:
            return
        out = self._out
        self._out, self._out_n = [], 0
        assert self._up is not None
        try:
            self._up.sendall(out[0] if len(out) == 1 else b"".join(out))
        except OSError as exc:
            raise self._lost(exc) from None

    def _flush_before_wait(self) -> None:
        """A peer's reader is about to wait for bytes: what is queued goes to the server first."""
        if self._out:
            with self._lock:
                self._flush_up()

    def _recv_answer(self, expect: int) -> bytearray:
        """The server's answer of ``expect`` bytes, with its size in front (as the peer gets it), lock
        held. Read in one call when it has all arrived: only this answer can be on the way, since
        everything queued before it has none."""
        self._flush_up()
        assert self._up is not None
        buf = bytearray(8 + expect)
        view = memoryview(buf)
        try:
            got = 0
            while got < 8:  # as much as has arrived: usually the whole answer
                k = self._up.recv_into(view[got:])
                if not k:
                    raise ConnectionError("connection closed")
                got += k
            (n,) = SIZE.unpack_from(buf, 0)
            if n != expect:
                raise OSError(f"answer of {n} bytes where {expect} were due")
            if got < 8 + expect:
                _recv_exact(self._up, 8 + expect - got, view[got:])  # type: ignore[arg-type]
        except (OSError, ConnectionError) as exc:
            raise self._lost(exc) from None
        return buf

    def _answer_framed(self, peer: _Peer, framed: bytearray) -> None:
        try:
            peer.conn.sendall(framed)
        except OSError as exc:
            raise Refused(f"does not read its answers ({exc or 'timeout'})") from None

    def _answer(self, peer: _Peer, answer: bytes | bytearray) -> None:
        try:
            if len(answer) <= 65536:
                peer.conn.sendall(SIZE.pack(len(answer)) + answer)
            else:  # e.g. a token's logits: no copy to put the size in front
                _send_parts(peer.conn, SIZE.pack(len(answer)), answer)
        except OSError as exc:
            raise Refused(f"does not read its answers ({exc or 'timeout'})") from None

    def _stream_answer(self, peer: _Peer, n: int) -> None:
        """A large GET_TENSOR answer, passed through chunk by chunk (lock held); the upstream is always
        drained to the end, even when the peer stops reading."""
        self._flush_up()
        assert self._up is not None
        try:
            (got,) = SIZE.unpack(_recv_exact(self._up, 8))
            if got != n:
                raise OSError(f"answer of {got} bytes where {n} were due")
        except (OSError, ConnectionError) as exc:
            raise self._lost(exc) from None
        peer_ok = True
        try:
            peer.conn.sendall(SIZE.pack(n))
        except OSError:
            peer_ok = False
        buf = bytearray(CHUNK)
        left = n
        while left:
            k = min(CHUNK, left)
            try:
                _recv_exact(self._up, k, buf)
            except (OSError, ConnectionError) as exc:
                raise self._lost(exc) from None
            if peer_ok:
                try:
                    peer.conn.sendall(memoryview(buf)[:k])
                except OSError:
                    peer_ok = False
            left -= k
        if not peer_ok:
            raise Refused("does not read its answers")

    def _set_tensor(self, peer: _Peer, size: int) -> None:
        check = self.check
        assert check is not None
        if size < SET_TENSOR_HEAD:
            raise Refused("SET_TENSOR shorter than its header")
        head = self._read(peer, SET_TENSOR_HEAD)
        region, data, _ = check.tensor(head, 0, peer.buffers, need_buffer=True)
        (offset,) = struct.unpack_from("<Q", head, T + 1)
        n = size - SET_TENSOR_HEAD
        check.region(region, data, offset, n)  # type: ignore[arg-type]
        self.stats["weight_bytes"] += n
        if n <= BUFFERED:
            body = self._read(peer, n)
            with self._lock:
                self._send_up(HEAD.pack(SET_TENSOR, size) + head, body)
            return
        # a large upload streams through with the upstream held; if the peer stalls, the rest is
        # filled with zeros (into the peer's own buffer) so the server stays in step, then the peer goes
        with self._lock:
            self._send_up(HEAD.pack(SET_TENSOR, size) + head)
            buf = bytearray(CHUNK)
            left = n
            stalled: str | None = None
            while left:
                k = min(CHUNK, left)
                if stalled is None:
                    try:
                        got = peer.reader.read_some(memoryview(buf), k)  # type: ignore[union-attr]
                        if got == 0:
                            raise ConnectionError("closed")
                    except (OSError, ConnectionError) as exc:
                        stalled = str(exc) or "timeout"
                        buf[:] = bytes(CHUNK)
                        continue
                else:
                    got = k
                self._send_up(b"", memoryview(buf)[:got])
                left -= got
        if stalled is not None:
            raise Refused(f"stalled or gone inside SET_TENSOR ({stalled})")

    def public(self) -> dict[str, Any]:
        with self._peers_lock:
            peers: list[dict[str, Any]] = [{"peer": p.addr, "buffers": len(p.buffers), "commands": p.commands}
                                           for p in self._peers.values()]
        direct = self.direct.public() if self.direct is not None else None
        if direct is not None and direct["peer"] is not None:  # served by llama.cpp itself: its buffers are unseen
            peers.append({"peer": direct["peer"], "buffers": None, "commands": None, "direct": True})
        return {"ready": self.ready.is_set() and self.broken is None, "error": self.broken, "peers": peers,
                "direct": direct,
                **self.stats, "by_command": {CMD_NAMES[i]: n for i, n in enumerate(self._by_command) if n}}


def _send_parts(sock: socket.socket, head: bytes, body: bytes | bytearray) -> None:
    """``sendall(head + body)`` without building the concatenation: one gathered send, then the rest."""
    sent = sock.sendmsg([head, body])
    if sent < len(head):
        sock.sendall(memoryview(head)[sent:])
        sent = len(head)
    if sent - len(head) < len(body):
        sock.sendall(memoryview(body)[sent - len(head):])


__all__ = ["GgmlRelay", "TensorCheck", "Refused"]

"""Security and robustness of an engine's control doors, on real engines and real sockets.

The merged port is gated like HTTP /control (address, then token); the ggml RPC server is reachable
only through a relay that checks commands; idle sockets cannot lock the control plane out; a state
upload that fails leaves its slot alone, a refused HTTP upload is answered, and a state nobody
vouched for is never served to a request that did not ask for that slot.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.common.registry import Registry
from hydrad.engine.rpc import ggml_relay as G
from hydrad.wire import protocol as P
from hydrad.wire.rpcclient import RpcClient, RpcError
from hydrad.engine.rpc.server import MergedPort
from hydrad.engine.settings import EngineSettings
from tests.support.engine import Engine
from tests.support.wait import eventually

SMOL = {"model": "smollm2-135m", "temperature": 0}
PROMPT_X = "A list of colours of the rainbow, in order: red, orange, yellow,"
PROMPT_Y = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(12))


def rpc_port(e: Engine) -> int:
    m = eventually(lambda: re.search(r"rpc=127\.0\.0\.1:(\d+)", e.log()), 20, "the merged port in the log",
                   interval=0.05, context=e.log)
    return int(m.group(1))


def read_all(s: socket.socket, timeout: float = 10) -> tuple[bytes, bool]:
    """Bytes until the peer closes (closed=True) or goes quiet for ``timeout``."""
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return out, True
            out += data
    except socket.timeout:
        return out, False
    except ConnectionResetError:
        return out, True


def error_of(data: bytes) -> P.Frame:
    frames = P.FrameDecoder(P.RESPONSE_CODES).feed(data)
    assert frames, data
    return frames[0]


def complete(e: Engine, prompt: str, slot: int | None = None, max_tokens: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if slot is not None:
        body["id_slot"] = slot
    r = e.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


# ---- 1. the merged port and the HTTP twins are gated like /control ------------------------------

def test_merged_port_refuses_peers_outside_control_allow_from(smollm_path: Path,
                                                             start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults=SMOL, extra={"rpc": {"port": 0}, "control_allow_from": ["10.0.0.0/8"]})
    e.wait_ready()
    port = rpc_port(e)
    for op, payload in ((P.Op.HELLO, {"version": 1}), (P.Op.INFO, {}), (P.Op.STATE_GET, {"slot": 0}),
                        (P.Op.STATE_PUT, {"slot": 0, "meta": {}}), (P.Op.ENGINE_CONFIGURE, {"temperature": 1})):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(P.encode_json(op, payload))
        data, closed = read_all(s)
        err = error_of(data)
        assert closed and err.code == P.Status.UNAUTHORIZED and err.json()["code"] == "forbidden", (op, data)
        s.close()
    # ggml-RPC compute from outside is closed without an answer
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(G.HEAD.pack(G.HELLO, G.CAPS_SIZE) + bytes(G.CAPS_SIZE))
    assert read_all(s) == (b"", True)
    # the HTTP twins answer 403 the same way
    assert e.http.get("/slots/0/state/meta").status_code == 403
    assert e.http.get("/control/config").status_code == 403


def test_token_gates_state_and_control_on_both_doors(smollm_path: Path, tmp_path: Path,
                                                     start_engine: Callable[..., Engine]) -> None:
    (tmp_path / "engine.token").write_text("c0ffee-5ecret-for-tests\n")
    e = start_engine(defaults=SMOL, extra={"rpc": {"port": 0, "token_file": "engine.token"}})
    e.wait_ready()
    port = rpc_port(e)
    complete(e, PROMPT_X, slot=0)
    with pytest.raises(RpcError) as no_token:
        RpcClient(("127.0.0.1", port), hello=False).state_get_bytes(0)
    assert no_token.value.status == P.Status.UNAUTHORIZED
    with pytest.raises(RpcError) as wrong:
        RpcClient(("127.0.0.1", port), token="c0ffee")
    assert wrong.value.status == P.Status.UNAUTHORIZED
    with RpcClient(("127.0.0.1", port), token="c0ffee-5ecret-for-tests") as c:
        meta, data = c.state_get_bytes(0)
        assert meta["n_tokens"] > 0 and data
    for path in ("/slots/0/state/meta", "/slots/0/state", "/control/config"):
        r = e.http.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
        assert "Authorization: Bearer" in r.json()["error"]["message"]
        assert e.http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert e.http.get(path, headers={"Authorization": "Bearer c0ffee-5ecret-for-tests"}).status_code == 200, path
    # the secret never shows in the daemon's effective settings
    assert "c0ffee-5ecret-for-tests" not in e.log()


# ---- 2. ggml-RPC only through the relay, which stops bad commands ------------------------------

class GgmlPeer:
    """A hand-written ggml-RPC client speaking the wire format of the bundled llama.cpp."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)

    def cmd(self, cmd: int, payload: bytes = b"", answer: bool = True) -> bytes | None:
        self.s.sendall(G.HEAD.pack(cmd, len(payload)) + payload)
        if not answer:
            return None
        (n,) = G.SIZE.unpack(G._recv_exact(self.s, 8))
        return bytes(G._recv_exact(self.s, n))

    def hello(self) -> bytes:
        answer = self.cmd(G.HELLO, bytes(G.CAPS_SIZE))
        assert answer is not None and answer[0] == G.PROTO_MAJOR
        return answer

    def alloc(self, size: int) -> tuple[int, int]:
        ptr, got = struct.unpack("<QQ", self.cmd(G.ALLOC_BUFFER, struct.pack("<IQ", 0, size)) or b"")
        (base,) = struct.unpack("<Q", self.cmd(G.BUFFER_GET_BASE, struct.pack("<Q", ptr)) or b"")
        assert ptr and got >= size
        return ptr, base

    def closed(self) -> bool:
        return read_all(self.s, 10)[1]


def f32_tensor(buffer: int, data: int, n: int = 16) -> bytes:
    return G.TENSOR.pack(1, 0, buffer, n, 1, 1, 1, 4, 4 * n, 4 * n, 4 * n, 0, *([0] * 16), 0, *([0] * 10), 0, 0,
                         data, b"t", 0)


def relay_info(port: int) -> dict[str, Any]:
    with RpcClient(("127.0.0.1", port)) as c:
        return c.info()["rpc"]["ggml_relay"]


def wait_relay(port: int) -> None:
    eventually(lambda: relay_info(port), 20, "the ggml relay to be ready", until=lambda info: info["ready"],
               interval=0.05)


def test_ggml_server_is_sealed_and_bad_commands_only_cost_the_sender(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(extra={"rpc": {"port": 0, "ggml_idle_timeout_s": 1.0}})
    e.notify.wait_for("READY=1")
    port = rpc_port(e)
    wait_relay(port)
    internal = int(re.search(r"ggml_rpc=127\.0\.0\.1:(\d+)", e.log()).group(1))  # type: ignore[union-attr]
    with pytest.raises(ConnectionRefusedError):  # nothing but the relay reaches llama.cpp's server
        socket.create_connection(("127.0.0.1", internal), timeout=5)

    # a peer holding a buffer, idle: it keeps it, and blocks nobody
    holder = GgmlPeer(port)
    holder.hello()
    h_ptr, h_base = holder.alloc(4096)

    bad_cases = {
        "GET_TENSOR past the buffer": lambda p, ptr, base: p.cmd(
            G.GET_TENSOR, f32_tensor(ptr, base + (1 << 20)) + struct.pack("<QQ", 0, 64)),
        "GET_TENSOR region past the end": lambda p, ptr, base: p.cmd(
            G.GET_TENSOR, f32_tensor(ptr, base) + struct.pack("<QQ", 0, 1 << 30)),
        "SET_TENSOR past the buffer": lambda p, ptr, base: p.cmd(
            G.SET_TENSOR, f32_tensor(ptr, base + 8192) + b"\0" + struct.pack("<Q", 0) + bytes(64), answer=False),
        "someone else's buffer": lambda p, ptr, base: p.cmd(
            G.GET_TENSOR, f32_tensor(h_ptr, h_base) + struct.pack("<QQ", 0, 64)),
        "unknown command": lambda p, ptr, base: p.cmd(99, b"", answer=False),
        "COPY_TENSOR overflow": lambda p, ptr, base: p.cmd(
            G.COPY_TENSOR, f32_tensor(ptr, base, 1000) + f32_tensor(ptr, base + 4000, 16)),
        "graph with a dangling node": lambda p, ptr, base: p.cmd(
            G.GRAPH_COMPUTE, struct.pack("<IIQI", 0, 1, 7, 1) + f32_tensor(ptr, base), answer=False),
    }
    for name, send in bad_cases.items():
        p = GgmlPeer(port)
        p.hello()
        ptr, base = p.alloc(4096)
        try:
            send(p, ptr, base)
        except (ConnectionError, OSError, struct.error):
            pass
        assert p.closed(), name
        assert e.proc.poll() is None, f"{name} took the engine down:\n{e.log()[-3000:]}"
    info = relay_info(port)
    assert info["refused"] == len(bad_cases) and info["ready"]

    # the holder is untouched, and a good GET_TENSOR of its own buffer works
    t0 = time.monotonic()
    data = holder.cmd(G.GET_TENSOR, f32_tensor(h_ptr, h_base) + struct.pack("<QQ", 0, 64))
    assert data is not None and len(data) == 64 and time.monotonic() - t0 < 2
    # a peer holding nothing that goes idle is closed after ggml_idle_timeout_s
    idle = GgmlPeer(port)
    idle.hello()
    assert idle.closed()
    assert e.http.get("/health").status_code in (200, 503) and e.proc.poll() is None


# ---- 3. the control plane cannot be locked out ---------------------------------------------

@pytest.mark.serial  # control served within a second
def test_idle_connections_cannot_lock_out_control(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(extra={"rpc": {"port": 0, "max_control_connections": 2, "max_pending_connections": 4,
                                    "handshake_timeout_s": 1.5}})
    e.notify.wait_for("READY=1")
    port = rpc_port(e)
    idle = []
    for _ in range(12):  # one byte each, never a complete request
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(bytes([P.Op.INFO]))
        idle.append(s)
    time.sleep(0.2)
    t0 = time.monotonic()
    with RpcClient(("127.0.0.1", port)) as a, RpcClient(("127.0.0.1", port)) as b:
        assert a.info()["engine"] == b.info()["engine"] == "test"
        assert time.monotonic() - t0 < 1.0  # served at once, not after the idle ones time out
        # identified sessions are what the cap counts, and an idle one makes room for a newcomer
        with RpcClient(("127.0.0.1", port)) as c:
            assert c.info()["engine"] == "test"
        with pytest.raises((RpcError, OSError)):
            a.info()  # the longest idle of the two gave its place up
    for s in idle:  # every idle one is gone by the handshake deadline: dropped as oldest, or timed out
        data, closed = read_all(s, 5)
        assert closed
        s.close()


class _NoThreads(MergedPort):
    """A merged port whose next ``fail`` connection threads cannot start (as when threads or memory run out)."""

    fail = 0

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("can't start new thread")
        super()._spawn(target, *args)


def test_a_thread_that_cannot_start_costs_one_connection_not_the_port() -> None:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    settings = EngineSettings(name="inproc", rpc={"port": 0, "ggml_rpc": False})
    core = EngineCore()
    control = EngineControl(core, Registry(Path(".")), {})
    port = _NoThreads(settings, control, loop, None, devices=lambda: [])
    try:
        n = port.start()
        port.fail = 2
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", n), timeout=10)
            s.sendall(P.encode_json(P.Op.HELLO, {"version": 1}))
            data, closed = read_all(s)
            assert closed and error_of(data).code == P.Status.BUSY
            s.close()
        with RpcClient(("127.0.0.1", n)) as c:  # the accept loop lives on
            assert c.info()["engine"] == "inproc"
        assert port.stats["spawn_failures"] == 2
    finally:
        port.close()
        loop.call_soon_threadsafe(loop.stop)


# ---- 4–6. KV state ---------------------------------------------------------------------------

def test_failed_state_put_leaves_the_slot_as_it_was(smollm_engine: Engine) -> None:
    e = smollm_engine
    port = rpc_port(e)
    first = complete(e, PROMPT_Y, slot=1)
    held = e.http.get("/slots").json()[1]["n_tokens"]
    with RpcClient(("127.0.0.1", port)) as c:
        meta, data = c.state_get_bytes(1)
        cut = data[: len(data) // 2]  # intact header, missing cells: llama.cpp refuses it
        with pytest.raises(RpcError) as refused:
            c.state_put(1, {**meta, "bytes": len(cut)}, cut)
    assert refused.value.code == "restore_failed" and "unchanged" in refused.value.message
    assert e.http.get("/slots").json()[1]["n_tokens"] == held
    again = complete(e, PROMPT_Y, slot=1)  # the KV is really there: no prefill, the same answer
    n_prompt = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_refused_http_state_put_is_answered_not_reset(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults=SMOL, extra={"rpc": {"port": 0, "max_state_bytes": 4096}})
    e.wait_ready()
    complete(e, PROMPT_Y, slot=0)
    with RpcClient(("127.0.0.1", rpc_port(e))) as c:
        meta, data = c.state_get_bytes(0)
    # a state as big as a long session's: far more than the socket buffers and the server's read-ahead hold
    big = 48 << 20
    body = P.encode_json(P.Status.STATE_META, {**meta, "bytes": big}) + P.HEADER.pack(P.Status.STATE_DATA, big) + bytes(big)
    for client in ("httpx", "http.client"):  # the standard library's client reads only after sending it all
        status, answer = put_state(client, e.url, "/slots/1/state", body)
        assert status == 413 and answer["error"]["code"] == "too_large", client
        status, answer = put_state(client, e.url, "/slots/99/state", body)
        assert status == 404 and "slot 99" in answer["error"]["message"], client


def put_state(client: str, url: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    if client == "httpx":
        r = httpx.put(url + path, content=body, timeout=60)
        return r.status_code, r.json()
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("PUT", path, body=body, headers={"Content-Type": "application/x-hydra-kv"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_untrusted_state_is_not_served_to_other_requests(smollm_path: Path, tmp_path: Path,
                                                        start_engine: Callable[..., Engine]) -> None:
    """A STATE_PUT whose token list lies about its KV (KV of prompt Y, tokens of prompt X) lands in a slot;
    an honest request for X that did not pin that slot must not be answered from it."""
    a = start_engine(name="a", defaults=SMOL)
    b = start_engine(name="b", defaults=SMOL)
    (tmp_path / "t").write_text("tok-123-for-the-tests")
    c_ = start_engine(name="c", defaults=SMOL, extra={"rpc": {"port": 0, "token_file": "t"}})
    for e in (a, b, c_):
        e.wait_ready()
    ref = complete(a, PROMPT_X, slot=1)
    complete(a, PROMPT_Y, slot=0)
    with RpcClient(("127.0.0.1", rpc_port(a))) as src:
        meta_x, _ = src.state_get_bytes(1)
        meta_y, data_y = src.state_get_bytes(0)
    forged = {**meta_y, "tokens": meta_x["tokens"], "n_tokens": meta_x["n_tokens"]}
    with RpcClient(("127.0.0.1", rpc_port(b))) as dst:
        put = dst.state_put(2, forged, data_y)
        assert put["trusted"] is False
        assert dst.info()["slots"][2]["foreign"] is True
    honest = complete(b, PROMPT_X)
    assert honest["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert honest["choices"][0]["text"] == ref["choices"][0]["text"]
    # the uploader's own session, pinned to that slot, may build on it
    pinned = complete(b, PROMPT_X, slot=2, max_tokens=1)
    assert pinned["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # an operator with the engine's token is trusted: that state is an ordinary cache
    with RpcClient(("127.0.0.1", rpc_port(c_)), token="tok-123-for-the-tests") as dst:
        meta_x_ok, data_x = RpcClient(("127.0.0.1", rpc_port(a))).state_get_bytes(1)
        assert dst.state_put(2, meta_x_ok, data_x)["trusted"] is True
        assert dst.info()["slots"][2]["foreign"] is False
    reused = complete(c_, PROMPT_X)
    assert reused["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_idle_identified_sessions_give_their_places_back(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(extra={"rpc": {"port": 0, "token": "s3cret", "max_control_connections": 2,
                                    "control_idle_timeout_s": 1.0}})
    e.notify.wait_for("READY=1")
    port = rpc_port(e)
    quiet = [RpcClient(("127.0.0.1", port), token="s3cret") for _ in range(2)]  # HELLO, then nothing
    time.sleep(0.1)
    with RpcClient(("127.0.0.1", port), token="s3cret") as c:  # the longest idle gave its place up at once
        assert c.info()["engine"] == "test"
    with pytest.raises((RpcError, OSError)):
        quiet[0].info()
    time.sleep(1.5)  # and a session quiet past control_idle_timeout_s is closed anyway
    with pytest.raises((RpcError, OSError)):
        quiet[1].info()
    for q in quiet:
        q.close()
    with RpcClient(("127.0.0.1", port), token="s3cret") as c:
        assert c.info()["engine"] == "test"
    assert e.proc.poll() is None


def test_idle_sessions_and_strangers_do_not_hold_a_configure_off(start_engine: Callable[..., Engine]) -> None:
    """100 sessions that said HELLO with the token and went quiet, and 100 connections that never
    authenticate, do not keep a configure waiting: it is answered at once, on the merged port and on HTTP."""
    e = start_engine(extra={"rpc": {"port": 0, "token": "s3cret-token-for-tests"}})
    e.notify.wait_for("READY=1")
    port = rpc_port(e)
    held: list[Any] = []
    try:
        for _ in range(100):
            held.append(RpcClient(("127.0.0.1", port), token="s3cret-token-for-tests"))
        for i in range(100):  # a stranger: nothing, half a HELLO, or a HELLO with a wrong token kept open
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 3 == 1:
                s.sendall(P.encode_json(P.Op.HELLO, {"version": 1, "token": "s3cret-token-for-tests"})[:7])
            held.append(s)
        t0 = time.monotonic()
        with RpcClient(("127.0.0.1", port), token="s3cret-token-for-tests", timeout=5) as c:
            answer = c.configure({"temperature": 0.3})
        assert time.monotonic() - t0 < 1.0 and answer["tier"] == "T1", answer
        r = e.http.post("/control/configure", json={"temperature": 0.4},
                        headers={"Authorization": "Bearer s3cret-token-for-tests"}, timeout=5)
        assert r.status_code == 200, r.text
        assert e.http.get("/control/config", headers={"Authorization": "Bearer s3cret-token-for-tests"}
                          ).json()["params"]["temperature"]["value"] == 0.4
    finally:
        for h in held:
            h.close()
    assert e.proc.poll() is None

"""The merged RPC port on a real engine: ggml-RPC relay, Hydra ops, bad input, BUSY, auth, KV state."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from hydrad.wire import protocol as P
from hydrad.wire.rpcclient import RpcClient, RpcError, migrate
from tests.support.engine import REPO, Engine, free_port
from tests.support.wait import eventually

GEN_SCRIPT = REPO / "tests" / "support" / "ggml_rpc_generate.py"
STOCK_SCRIPT = REPO / "tests" / "support" / "stock_ggml_rpc.py"


def wait_listening(port: int, timeout: float = 30.0) -> None:
    eventually(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, timeout,
               f"a listener on port {port}", interval=0.05, ignore=(OSError,))


def rpc_addr(e: Engine) -> str:
    return f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}"


def raw(e: Engine) -> socket.socket:
    host, port = rpc_addr(e).split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def read_frames(s: socket.socket, timeout: float = 10) -> tuple[list[P.Frame], bool]:
    """Frames until the server closes (returns closed=True) or goes quiet."""
    dec = P.FrameDecoder(P.RESPONSE_CODES)
    frames: list[P.Frame] = []
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return frames, True
            frames.extend(dec.feed(data))
            s.settimeout(0.5)
    except socket.timeout:
        return frames, False
    except ConnectionResetError:  # closed with our unread bytes still queued: the kernel sends RST
        return frames, True


def still_serving(e: Engine) -> None:
    assert e.http.get("/health").json()["status"] in ("ok", "idle")
    with RpcClient(rpc_addr(e)) as c:
        assert c.info()["engine"] == e.config.stem


# ---- ggml-RPC through the merged port ------------------------------------------------------

def test_ggml_rpc_through_merged_port_matches_stock_server(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """A peer process puts every layer of SmolLM2 on this engine's device through the merged port (the relay
    checks every command); its greedy tokens equal those it gets from llama.cpp's stock ggml RPC server run
    on its own. Hydra ops answer on the same port meanwhile."""
    e = start_engine()
    e.notify.wait_for("READY=1")
    results: dict[str, Any] = {}
    infos: list[dict[str, Any]] = []

    def gen(name: str, endpoint: str) -> None:
        r = subprocess.run([sys.executable, str(GEN_SCRIPT), endpoint, str(smollm_path), "The capital of France is", "20"],
                           capture_output=True, text=True, timeout=300, cwd=str(REPO))
        assert r.returncode == 0, r.stderr[-2000:]
        results[name] = json.loads(r.stdout.strip().splitlines()[-1])

    t = threading.Thread(target=gen, args=("merged", rpc_addr(e)))
    t.start()
    while t.is_alive():  # Hydra ops on the same port while ggml-RPC traffic flows
        with RpcClient(rpc_addr(e)) as c:
            infos.append(c.info())
        time.sleep(0.2)
    t.join()
    port = free_port()
    stock = subprocess.Popen([sys.executable, str(STOCK_SCRIPT), str(port)], cwd=str(REPO),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        gen("stock", f"127.0.0.1:{port}")
    finally:
        stock.kill()
        stock.wait(10)
    assert results["merged"]["tokens"] == results["stock"]["tokens"]
    assert len(results["merged"]["tokens"]) == 20 and "Paris" in results["merged"]["text"]
    assert infos and infos[-1]["rpc"]["ggml_rpc_devices"][0]["type"] in ("cpu", "gpu")
    relay = infos[-1]["rpc"]["ggml_relay"]
    assert relay["ready"] and relay["refused"] == 0 and relay["commands"] > 0
    with RpcClient(rpc_addr(e)) as c:  # the peer's buffers went with it
        assert c.info()["rpc"]["ggml_relay"]["peers"] == []


# ---- bad input -----------------------------------------------------------------------------

def test_unknown_first_byte_is_closed(start_engine: Callable[..., Engine]) -> None:
    e = start_engine()
    e.notify.wait_for("READY=1")
    s = raw(e)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
    frames, closed = read_frames(s)
    assert closed and frames == []
    still_serving(e)


def test_malformed_frames_get_error_status_and_engine_keeps_serving(start_engine: Callable[..., Engine]) -> None:
    e = start_engine()
    e.notify.wait_for("READY=1")
    cases = {
        "unknown op": P.encode_json(P.Op.HELLO, {"version": 1}) + P.HEADER.pack(0x3F, 0),
        "oversized": P.HEADER.pack(P.Op.INFO, 1 << 40),
        "bad json": P.encode(P.Op.INFO, b"{nope"),
        "continuation op first": P.encode_json(P.Op.HELLO, {"version": 1}) + P.encode(P.Op.STATE_DATA, b"xx"),
    }
    expect = {"unknown op": P.Status.UNKNOWN_OP, "oversized": P.Status.TOO_LARGE, "bad json": P.Status.BAD_REQUEST,
              "continuation op first": P.Status.BAD_REQUEST}
    for name, data in cases.items():
        s = raw(e)
        s.sendall(data)
        frames, _ = read_frames(s)
        codes = [f.code for f in frames]
        assert expect[name] in codes, (name, codes)
        err = [f for f in frames if f.code == expect[name]][0].json()
        assert err["message"], name
        s.close()
    # truncated frame, then the client goes away
    s = raw(e)
    s.sendall(P.HEADER.pack(P.Op.INFO, 100) + b"{")
    s.close()
    # a connection that never sends a byte does not block others
    idle = raw(e)
    still_serving(e)
    idle.close()
    assert e.proc.poll() is None


@pytest.mark.serial  # its requests must still be inside the engine when one more connection asks: timing under load
def test_busy_only_when_every_session_is_inside_a_request(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """Two places: two sessions each inside a STATE_PUT (waiting for its data) hold them, and a third
    gets BUSY; an idle session instead gives its place to the newcomer."""
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0}, extra={"rpc": {"max_control_connections": 2}})
    e.wait_ready()
    assert e.http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "id_slot": 0}).status_code == 200
    with RpcClient(rpc_addr(e)) as c:
        meta, _ = c.state_get_bytes(0)
    inside = [RpcClient(rpc_addr(e)) for _ in range(2)]
    for c in inside:  # STATE_PUT announced, CONTINUE answered: the session is inside a request until its data ends
        c.send(P.encode_json(P.Op.STATE_PUT, {"slot": 1, "meta": meta}))
        assert c.recv().code == P.Status.CONTINUE
    s = raw(e)
    s.sendall(P.encode_json(P.Op.INFO, {}))
    frames, closed = read_frames(s)
    assert [f.code for f in frames] == [P.Status.BUSY] and closed
    inside[0].close()  # its upload abandoned: the place is free again
    time.sleep(0.2)
    idle = RpcClient(rpc_addr(e))  # takes that place, then sits idle
    assert idle.info()["engine"]
    with RpcClient(rpc_addr(e)) as c:  # every place held, one of them idle: it makes room
        assert c.info()["engine"]
    with pytest.raises((RpcError, OSError)):
        idle.info()
    idle.close()
    inside[1].close()
    still_serving(e)


def test_token_auth(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(extra={"rpc": {"port": 0, "token": "s3cret"}})
    e.notify.wait_for("READY=1")
    time.sleep(0.2)
    port = int(re.search(r"rpc=127\.0\.0\.1:(\d+)", e.log()).group(1))  # type: ignore[union-attr]
    with pytest.raises(RpcError) as no_hello:
        RpcClient(("127.0.0.1", port), hello=False).info()
    assert no_hello.value.status == P.Status.UNAUTHORIZED
    with pytest.raises(RpcError) as wrong:
        RpcClient(("127.0.0.1", port), token="wrong")
    assert wrong.value.status == P.Status.UNAUTHORIZED
    with RpcClient(("127.0.0.1", port), token="s3cret") as c:
        assert c.info()["engine"] == "test"


def test_ops_table(smollm_engine: Engine) -> None:
    with RpcClient(rpc_addr(smollm_engine)) as c:
        assert c.server["version"] == P.PROTOCOL_VERSION and c.server["engine"] == "test"
        info = c.info()
        assert info["model"]["id"] == "smollm2-135m" and len(info["model"]["fingerprint"]) == 32
        assert len(info["slots"]) == 4 and info["params"]["n_ctx"]["tier"] == "T2"
        assert c.configure({"temperature": 0.3})["tier"] == "T1"
        assert c.configure({"temperature": 0.3})["tier"] == "none"
        with pytest.raises(RpcError) as t4:
            c.configure({"rpc": {"port": 1}})
        assert t4.value.status == P.Status.BAD_REQUEST and "rpc" in t4.value.message
        with pytest.raises(RpcError) as unknown:
            c.configure({"model": "nope"})
        assert unknown.value.status == P.Status.NOT_FOUND
        with pytest.raises(RpcError) as dense:  # SmolLM2 has no experts to move (the switch: test_combine.py)
            c.call(P.Op.SET_EXPERT_MODE, {"mode": "combine", "peer": "127.0.0.1:1"})
        assert dense.value.status == P.Status.BAD_REQUEST and dense.value.code == "not_moe"
        with pytest.raises(RpcError) as no_model:
            c.call(P.Op.SWAP_QUANT, {})
        assert no_model.value.status == P.Status.BAD_REQUEST and "model" in no_model.value.message
        with pytest.raises(RpcError) as retired:
            c.call(P.Op.PIPELINE_ATTACH, {})
        assert retired.value.code == "retired" and "ENGINE_CONFIGURE" in retired.value.message
        with pytest.raises(RpcError) as hello_v:
            c.call(P.Op.HELLO, {"version": 99})
        assert hello_v.value.code == "version_mismatch"


# ---- KV state and migration ------------------------------------------------------------------

PROMPT = " ".join(f"Fact {i}: the number {i * 7} is written as {i * 7:b} in binary." for i in range(60))


def test_migration_is_token_identical(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    a = start_engine(name="a", defaults={"model": "smollm2-135m", "temperature": 0})
    b = start_engine(name="b", defaults={"model": "smollm2-135m", "temperature": 0})
    a.wait_ready()
    b.wait_ready()
    first = a.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 0}).json()
    n_prompt = first["usage"]["prompt_tokens"]
    assert 800 <= n_prompt <= 1600, n_prompt
    res = migrate(rpc_addr(a), rpc_addr(b), slot=0, dst_slot=0)
    assert res["n_tokens"] == n_prompt and res["bytes"] > 0
    # Restore the same state on A as well, so both engines hold it in the same KV cells: with a unified KV
    # cache, where the recomputed last token lands changes the reduction order, and a near-tie in a 135M
    # model can then flip a greedy pick. Compared like with like, the continuation is token-identical.
    with RpcClient(rpc_addr(a)) as c:
        meta, data = c.state_get_bytes(0)
        c.state_put(0, meta, data)
    on_a = a.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "id_slot": 0}).json()
    on_b = b.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "id_slot": 0}).json()
    assert on_b["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1  # no re-prefill on B
    assert on_b["choices"][0]["text"] == on_a["choices"][0]["text"]
    assert on_b["timings"]["prompt_n"] == 1


def test_incompatible_state_is_refused_and_slot_untouched(smollm_path: Path, gemma_path: Path,
                                                          start_engine: Callable[..., Engine]) -> None:
    a = start_engine(name="a", defaults={"model": "smollm2-135m", "temperature": 0})
    g = start_engine(name="g", defaults={"model": "gemma3-270m", "temperature": 0})
    a.wait_ready()
    g.wait_ready()
    a.http.post("/v1/completions", json={"prompt": "Hello there, general", "max_tokens": 4, "id_slot": 0})
    g.http.post("/v1/completions", json={"prompt": "Kept tokens in the gemma slot", "max_tokens": 2, "id_slot": 0})
    before = g.http.get("/slots").json()[0]["n_tokens"]
    assert before > 0
    with pytest.raises(RpcError) as refused:
        migrate(rpc_addr(a), rpc_addr(g), slot=0)
    assert refused.value.status == P.Status.INCOMPATIBLE and "another model" in refused.value.message
    assert g.http.get("/slots").json()[0]["n_tokens"] == before
    # a corrupted stream (data does not match STATE_END) is refused too, slot unchanged
    with RpcClient(rpc_addr(a)) as src:
        meta, data = src.state_get_bytes(0)
    with RpcClient(rpc_addr(a)) as dst:
        dst.send(P.encode_json(P.Op.STATE_PUT, {"slot": 2, "meta": meta}))
        assert dst.recv().code == P.Status.CONTINUE
        dst.send(P.encode(P.Op.STATE_DATA, data))
        dst.send(P.encode_json(P.Op.STATE_END, {"bytes": len(data), "xxh3_128": "0" * 32}))
        reply = dst.recv()
        assert reply.code == P.Status.BAD_REQUEST and "unchanged" in reply.json()["message"]
    assert a.http.get("/slots").json()[2]["n_tokens"] == 0


def test_http_state_twins_round_trip(smollm_engine: Engine) -> None:
    e = smollm_engine
    e.http.post("/v1/completions", json={"prompt": PROMPT[:400], "max_tokens": 2, "id_slot": 0})
    meta = e.http.get("/slots/0/state/meta").json()
    assert meta["format"] == "hydra-kv/1" and meta["n_tokens"] > 50
    stream = e.http.get("/slots/0/state")
    assert stream.status_code == 200 and stream.headers["content-type"] == "application/x-hydra-kv"
    put = e.http.put("/slots/3/state", content=stream.content)
    assert put.status_code == 200, put.text
    assert put.json()["n_tokens"] == meta["n_tokens"]
    slots = e.http.get("/slots").json()
    assert slots[3]["n_tokens"] == meta["n_tokens"]
    bad = e.http.put("/slots/2/state", content=stream.content[: len(stream.content) // 2])
    assert bad.status_code == 400 and "unchanged" in bad.json()["error"]["message"]
    assert e.http.get("/slots").json()[2]["n_tokens"] == 0
    assert e.http.get("/slots/9/state/meta").status_code == 404
    # a meta whose size is JSON true (a bool is an int in Python) is refused by name, not a 500
    forged = P.encode_json(P.Status.STATE_META, {**meta, "bytes": True}) + stream.content[len(P.encode_json(
        P.Status.STATE_META, meta)):]
    refused = e.http.put("/slots/2/state", content=forged)
    assert refused.status_code == 413 and "meta.bytes" in refused.json()["error"]["message"], refused.text
    assert e.http.get("/slots").json()[2]["n_tokens"] == 0


def test_state_get_of_a_busy_slot_is_a_conflict(smollm_engine: Engine) -> None:
    e = smollm_engine
    done = threading.Event()

    def long_request() -> None:
        e.http.post("/v1/completions", json={"prompt": "Go on forever", "max_tokens": 400, "ignore_eos": True,
                                             "id_slot": 0}, timeout=120)
        done.set()

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 30
    while not e.http.get("/slots").json()[0]["is_processing"] and time.monotonic() < deadline:
        time.sleep(0.01)
    with RpcClient(rpc_addr(e)) as c, pytest.raises(RpcError) as busy:
        c.state_get(0)
    assert busy.value.status == P.Status.CONFLICT
    t.join(120)
    assert done.is_set()

"""COMBINE on loopback with CPU devices: a head engine lends a peer engine's device over the
peer's merged port (layer split, expert split), against llama.cpp's stock ggml RPC server as the
yardstick; the roles both engines report; the tensor cache on a second load; and a peer that is
not there or not ggml-RPC, which fails the load and nothing else.

(No GPU here: both devices are CPUs. The placement code is the same; which device is which is
what the GPU host's benchmark exercises, docs/benchmarks.md.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydrad.wire.rpcclient import RpcClient
from tests.support.engine import REPO, Engine, free_port, terminate
from tests.support.wait import eventually

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
N_TOKENS = 16
HEAD = {"n_threads": 1, "n_ctx": 512, "n_parallel": 1, "temperature": 0}


def rpc_port(engine: Engine) -> int:
    return int(yaml.safe_load(engine.config.read_text())["rpc"]["port"])


def info(engine: Engine) -> dict[str, Any]:
    with RpcClient(("127.0.0.1", rpc_port(engine))) as c:
        return c.info()


def relay_stats(engine: Engine) -> dict[str, Any]:
    return info(engine)["rpc"]["ggml_relay"]


def greedy(engine: Engine, prompt: str = PROMPT, n: int = N_TOKENS) -> list[str]:
    """The tokens of a greedy completion, one piece each (streamed, so token boundaries show)."""
    pieces: list[str] = []
    with engine.http.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                             "stream": True, "ignore_eos": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                body = json.loads(line[6:])
                pieces.extend(c["text"] for c in body["choices"] if c.get("text"))
    return pieces


def load(engine: Engine, **payload: Any) -> dict[str, Any]:
    r = engine.configure(**payload)
    assert r.status_code == 200, r.text
    body = r.json()
    if payload.get("model", "") is not None:  # an unload has no load record
        assert body["load"]["phase"] == "done", body
    return body


@pytest.fixture
def peer(smollm_path: Path, start_engine: Callable[..., Engine], tmp_path: Path) -> Engine:
    """An engine without a model, lending its CPU over its merged port (one compute thread)."""
    e = start_engine(name="peer", defaults={"n_threads": 1},
                     extra={"rpc": {"ggml_threads": 1, "cache_dir": str(tmp_path / "tensor-cache")}})
    eventually(lambda: relay_stats(e), 60, "the peer's ggml-RPC relay", until=lambda s: s["ready"],
               ignore=(OSError,), context=e.log)
    return e


@pytest.fixture
def stock() -> Iterator[str]:
    """llama.cpp's own ggml RPC server in a process of its own, one thread: the yardstick."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "stock_ggml_rpc.py"), str(port)],
                            cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def up() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    eventually(up, 30, "the stock ggml RPC server", ignore=(OSError,))
    yield f"127.0.0.1:{port}"
    terminate(proc, 10)


@pytest.fixture
def head(start_engine: Callable[..., Engine]) -> Engine:
    e = start_engine(name="head", defaults=HEAD)
    e.notify.wait_for("READY=1", 60)
    return e


def test_layer_split_through_the_merged_port_matches_the_stock_server(head: Engine, peer: Engine, stock: str) -> None:
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    combined = greedy(head)

    # both engines say what they are, from their own state
    h = head.http.get("/health").json()
    assert h["mode"] == "combine" and h["role"] == "head" and h["peers"] == [endpoint]
    p = peer.http.get("/health").json()
    assert p["mode"] == "combine" and p["role"] == "peer" and "model" not in p  # the peer holds no model
    assert len(p["serving"]) == 1 and p["serving"][0]["buffers"] > 0
    placement = info(head)["combine"]["placement"]
    assert placement["cpu_share"] == 0.5 and placement["n_gpu_layers"] == 16  # 15 of 30 layers + output
    assert placement["devices"] == [f"RPC0[{endpoint}]"]

    # the same head, the same split, llama.cpp's stock server as the peer
    load(head, rpc_servers=[stock])
    assert greedy(head) == combined
    # the head lets go of the peer's buffers when its reaper frees the retired split (reaper.delay_ms after the switch)
    eventually(lambda: peer.http.get("/health").json(), 15, "the peer released", until=lambda h: h["role"] == "solo",
               context=peer.log)

    load(head, rpc_servers=None, tensor_split=None)  # back to SOLO: a T3 reload
    solo = greedy(head)
    assert head.http.get("/health").json()["role"] == "solo"
    agree = next((i for i, (a, b) in enumerate(zip(solo, combined)) if a != b), len(combined))
    print(f"SOLO and COMBINE agree on the first {agree} of {len(combined)} greedy tokens")
    assert agree >= 1


def test_a_repeated_graph_is_recomputed_not_resent(start_engine: Callable[..., Engine], peer: Engine,
                                                    stock: str) -> None:
    """A head whose llama.cpp rebuilds the graph every token (graph reuse off, as a GPU head was seen to
    do) sends GRAPH_COMPUTE with the same bytes each time; the relay has the server recompute the graph
    it holds instead, and the tokens stay those of the stock server, which deserialises every one."""
    head = start_engine(name="rebuilding-head", defaults=HEAD, env={"LLAMA_GRAPH_REUSE_DISABLE": "1"})
    head.notify.wait_for("READY=1", 60)
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    before = relay_stats(peer)
    combined = greedy(head)
    after = relay_stats(peer)
    recomputed = after["graphs_recomputed"] - before["graphs_recomputed"]
    assert recomputed >= N_TOKENS // 2, (before, after)
    load(head, rpc_servers=[stock])
    assert greedy(head) == combined


def test_a_control_flood_at_the_peers_port_drops_no_combine_compute(head: Engine, peer: Engine) -> None:
    """The peer's merged port carries the head's ggml-RPC compute and anyone's control connections alike:
    300 connections a second at it (half junk, half INFO) while the head decodes through it; every
    answer the head gives meanwhile is whole and the same as without the flood."""
    import threading

    from tests.support import floods

    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    quiet = greedy(head)
    report: dict[str, Any] = {}
    attack = threading.Thread(target=lambda: report.update(floods.control(rpc_port(peer), 300, 4)))
    attack.start()
    answers = []
    while attack.is_alive() and len(answers) < 6:
        answers.append(greedy(head))
    attack.join(60)
    assert answers and all(a == quiet for a in answers), (quiet, answers)
    out = report["outcomes"]
    assert report["connections"] >= 600, report
    assert out.get("info:ok", 0) + out.get("info:busy", 0) >= 1, out  # the peer kept answering its control door
    assert head.http.get("/health").json()["role"] == "head"


def test_a_second_load_finds_large_tensors_in_the_peers_cache(head: Engine, peer: Engine) -> None:
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    before = relay_stats(peer)
    load(head, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    first = relay_stats(peer)
    load(head, model=None)
    load(head, model="smollm2-135m")
    second = relay_stats(peer)
    first_bytes = first["weight_bytes"] - before["weight_bytes"]
    second_bytes = second["weight_bytes"] - first["weight_bytes"]
    hits = second["cache_hits"] - first["cache_hits"]
    print(f"weights sent to the peer: first load {first_bytes} B, second {second_bytes} B "
          f"({second['cache_hit_bytes'] - first['cache_hit_bytes']} B found by hash)")
    # llama.cpp offers by hash only tensors over 10 MiB: here the output matrix (the tied embedding)
    assert first["cache_misses"] - before["cache_misses"] >= 1 and hits >= 1
    assert second_bytes <= first_bytes - (second["cache_hit_bytes"] - first["cache_hit_bytes"])


def test_expert_split_of_a_tiny_moe_matches_the_stock_server(head: Engine, peer: Engine, stock: str,
                                                              tmp_path: Path) -> None:
    moe = tmp_path / "tiny-moe.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_moe.py"), str(moe)], check=True, cwd=str(REPO),
                   capture_output=True, timeout=120)
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    experts = [r"\.ffn_(up|down|gate)_exps=RPC"]
    load(head, model=str(moe), rpc_servers=[endpoint], tensor_split=[1.0, 0.0], override_tensors=experts)
    placement = info(head)["combine"]["placement"]
    assert placement["n_gpu_layers"] == 0 and placement["override_tensors"] == experts  # layers home, experts away
    assert relay_stats(peer)["peers"][0]["buffers"] >= 1
    combined = greedy(head, n=8)
    load(head, rpc_servers=[stock])
    assert greedy(head, n=8) == combined
    load(head, rpc_servers=None, override_tensors=None, tensor_split=None)
    assert greedy(head, n=8) == combined  # the same CPU kernels compute the experts either way


@pytest.mark.parametrize("target, reason", [
    ("closed", "unreachable"),
    ("http", "not a ggml-RPC server"),
])
def test_a_peer_that_is_not_there_fails_the_load_alone(head: Engine, target: str, reason: str) -> None:
    endpoint = f"127.0.0.1:{free_port()}" if target == "closed" else f"127.0.0.1:{head.port}"
    r = head.configure(model="smollm2-135m", rpc_servers=[endpoint])
    err = r.json()["error"]
    assert r.status_code == 422 and err["code"] == "load_failed", r.text
    assert f"rpc_servers: peer {endpoint}" in err["message"] and reason in err["message"], r.text
    head.assert_running()
    assert head.http.get("/livez").status_code == 200
    load(head, model="smollm2-135m", rpc_servers=None)
    assert len(greedy(head, n=4)) == 4


def test_an_unknown_buffer_type_names_the_known_ones(head: Engine) -> None:
    r = head.configure(model="smollm2-135m", override_tensors=["ffn_up=NOPE0"])
    err = r.json()["error"]["message"]
    assert "override_tensors: unknown buffer type 'NOPE0'" in err and "known: CPU" in err, r.text
    head.assert_running()


def test_a_peer_that_dies_between_requests_leaves_a_solo_engine(head: Engine, peer: Engine) -> None:
    """The head's watch sees the peer go, sets the split generation aside without touching the peer
    (llama.cpp would abort), and reloads SOLO: the next request is served, not garbage, not an abort."""
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model="smollm2-135m")
    alone = greedy(head)  # the reference: on some CPUs the peer's backend rounds differently from the head's
    load(head, rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    assert head.http.get("/health").json()["role"] == "head"
    assert greedy(head)
    peer.proc.kill()
    peer.proc.wait(10)

    def solo() -> dict[str, Any]:
        head.assert_running()
        return head.http.get("/health").json()

    h = eventually(solo, 60, "the head back in SOLO", until=lambda h: h["status"] == "ok" and h["role"] == "solo",
                   context=head.log)
    assert "peers" not in h
    assert greedy(head) == alone  # SOLO again answers as SOLO did before the split
    assert "COMBINE peer lost" in head.log() and "reloading SOLO" in head.log()
    assert "hydra_peer_losses_total 1.0" in head.http.get("/metrics").text.splitlines()
    params = info(head)["params"]
    assert not any(layer.get("rpc_servers") for layer in params.values() if isinstance(layer, dict))


@pytest.fixture
def tiny_moe(tmp_path: Path) -> Path:
    moe = tmp_path / "tiny-moe.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_moe.py"), str(moe)], check=True, cwd=str(REPO),
                   capture_output=True, timeout=120)
    return moe


def set_mode(engine: Engine, **body: Any) -> Any:
    return engine.http.post("/control/set_expert_mode?wait=1", json=body)


@pytest.mark.serial  # switches timed under 100 ms
def test_expert_mode_switches_between_resident_placements(head: Engine, peer: Engine, tiny_moe: Path) -> None:
    """The first switch to COMBINE loads the expert split and keeps SOLO resident; every later switch
    only exchanges the two, well under 100 ms, and each mode answers as before the round trip."""
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model=str(tiny_moe))
    solo = greedy(head, n=8)

    r = set_mode(head, mode="combine", peer=endpoint)
    assert r.status_code == 200 and r.json()["resident"] is False and r.json()["load"]["phase"] == "done", r.text
    pair = info(head)["combine"]
    assert pair["role"] == "head" and pair["standby"]["mode"] == "solo"
    assert pair["placement"]["override_tensors"][0].endswith("exps=RPC") and pair["placement"]["n_gpu_layers"] == 0
    combined = greedy(head, n=8)

    seconds = []
    for mode, want in (("solo", solo), ("combine", combined), ("solo", solo), ("combine", combined)):
        r = set_mode(head, mode=mode)
        body = r.json()
        assert r.status_code == 200 and body["switched"] and body["resident"], r.text
        seconds.append(body["seconds"])
        assert head.http.get("/health").json()["role"] == ("head" if mode == "combine" else "solo")
        assert greedy(head, n=8) == want
    print(f"expert-mode switches, engine-side seconds: {seconds}")
    assert max(seconds) < 0.1
    assert set_mode(head, mode="combine").json()["switched"] is False  # already there

    # the merged port's SET_EXPERT_MODE (0x44) does the same
    with RpcClient(("127.0.0.1", rpc_port(head))) as c:
        from hydrad.wire import protocol as P

        assert c.call(P.Op.SET_EXPERT_MODE, {"mode": "solo"})["resident"] is True
        with pytest.raises(Exception) as bad:
            c.call(P.Op.SET_EXPERT_MODE, {"mode": "both"})
        assert "mode must be 'solo' or 'combine'" in str(bad.value)


def test_expert_mode_is_refused_while_decoding_and_for_dense_models(head: Engine, peer: Engine,
                                                                    tiny_moe: Path) -> None:
    endpoint = f"127.0.0.1:{rpc_port(peer)}"
    load(head, model="smollm2-135m")
    r = set_mode(head, mode="combine", peer=endpoint)
    assert r.status_code == 400 and r.json()["error"]["code"] == "not_moe", r.text
    load(head, model=str(tiny_moe))
    assert set_mode(head, mode="combine", peer=endpoint).status_code == 200
    for bad, code in (({"mode": "sideways"}, "invalid_param"), ({"mode": "combine", "peer": 7}, "invalid_param"),
                      ({"mode": "solo", "extra": 1}, "unsupported_field")):
        r = set_mode(head, **bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    import threading

    r = head.configure(n_ctx=2048)  # room for a long answer (T2: the standby goes with the old context)
    assert r.status_code == 200 and r.json()["tier"] == "T2", r.text
    assert set_mode(head, mode="solo").json()["resident"] is False  # so this is a load again
    assert set_mode(head, mode="combine").json()["resident"] is True
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(len(greedy(head, n=1500))))
    t.start()
    eventually(lambda: head.http.get("/slots").json(), 30, "a slot decoding",
               until=lambda rows: any(s.get("is_processing") for s in rows), interval=0.01)
    r = set_mode(head, mode="solo")
    assert r.status_code == 409 and r.json()["error"]["code"] == "slots_busy" and r.headers["retry-after"] == "1"
    t.join(300)
    assert done == [1500]
    assert set_mode(head, mode="solo").json()["resident"] is True


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                     | st.text(max_size=40), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                               max_size=3),
                     max_leaves=8)
_ENDPOINTS = st.one_of(st.sampled_from(["127.0.0.1:1", "[::1]:2", "localhost:65535", "h:0", ":9", "a b:1", "x" * 301]),
                       st.text(max_size=30))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional={
    "mode": st.one_of(st.sampled_from(["solo", "combine", "SOLO", ""]), _JSON),
    "peer": st.one_of(_ENDPOINTS, _JSON),
    "override_tensors": st.one_of(st.lists(st.sampled_from(["exps=RPC", "(=CPU", "x=", "=CPU", "a=NOPE"]), max_size=3),
                                  _JSON),
    "rpc_servers": st.one_of(st.lists(_ENDPOINTS, max_size=9), _JSON),
    "tensor_split": st.one_of(st.lists(st.floats(), max_size=4), _JSON),
}), door=st.sampled_from(["set_expert_mode", "configure"]))
def test_hostile_combine_fields_get_a_clear_answer(head: Engine, body: dict[str, Any], door: str) -> None:
    """Any value of the COMBINE fields, at either control door: a JSON answer, 2xx or 4xx, never a 5xx,
    and the engine alive after (a peer that cannot be reached fails the load, nothing else)."""
    if door == "configure":
        body = {"model": "smollm2-135m", **{k: v for k, v in body.items() if k not in ("mode", "peer")}}
    # NaN and Infinity go out as the bare words Python writes: not JSON, which is a 400 as well
    r = head.http.post(f"/control/{door}?wait=1", content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]["code"], r.text
    head.assert_running()
    assert head.http.get("/livez").status_code == 200


# ----- the direct line: a trusted peer handed to llama.cpp's own server --------------------------


def direct_peer(start_engine: Callable[..., Engine], tmp_path: Path, name: str, networks: list[str]) -> Engine:
    e = start_engine(name=name, defaults={"n_threads": 1},
                     extra={"rpc": {"ggml_threads": 1, "cache_dir": str(tmp_path / f"tensor-cache-{name}"),
                                    "ggml_direct_from": networks}})
    eventually(lambda: relay_stats(e), 60, "the peer's direct line", until=lambda s: s["ready"] and s["direct"]["ready"],
               ignore=(OSError,), context=e.log)
    return e


def test_a_trusted_peer_is_served_by_llama_cpps_own_server(head: Engine, stock: str, tmp_path: Path,
                                                            start_engine: Callable[..., Engine]) -> None:
    """A head from ``rpc.ggml_direct_from`` is handed to the server whole: the relay sees none of its
    commands, the answers are the stock server's, the peer still reports whom it serves, and after the
    head lets go the line takes the next head again. A head from elsewhere still goes through the relay."""
    trusted = direct_peer(start_engine, tmp_path, "peer-direct", ["127.0.0.0/8"])
    endpoint = f"127.0.0.1:{rpc_port(trusted)}"
    load(head, model="smollm2-135m", rpc_servers=[stock], tensor_split=[0.5, 0.5])
    reference = greedy(head)
    for _ in range(2):  # the second time: the line was primed again after the first head let go
        load(head, rpc_servers=[endpoint])
        assert greedy(head) == reference
        stats = relay_stats(trusted)
        # llama.cpp's connections are the server's; only the head's peer watch (a second connection, made
        # while the line is taken) goes through the relay, with nothing but its DEVICE_COUNT keepalives
        assert set(stats["by_command"]) <= {"DEVICE_COUNT"} and stats["direct"]["handed_over"] >= 1, stats
        assert stats["weight_bytes"] == 0 and stats["peers_served"] <= 2 * (_ + 1), stats
        p = trusted.http.get("/health").json()
        assert p["role"] == "peer" and p["serving"] == [{"peer": "127.0.0.1", "buffers": None, "direct": True}], p
        load(head, rpc_servers=None, tensor_split=None)
        eventually(lambda: relay_stats(trusted)["direct"], 10, "the line free again",
                   until=lambda d: d["peer"] is None and d["ended"] == d["handed_over"], context=trusted.log)
        assert trusted.http.get("/health").json()["role"] == "solo"
        load(head, rpc_servers=[stock], tensor_split=[0.5, 0.5])

    elsewhere = direct_peer(start_engine, tmp_path, "peer-relay", ["10.0.0.0/8"])  # loopback is not trusted there
    load(head, rpc_servers=[f"127.0.0.1:{rpc_port(elsewhere)}"])
    assert greedy(head) == reference
    stats = relay_stats(elsewhere)
    assert stats["commands"] > 0 and stats["direct"]["handed_over"] == 0, stats


def test_the_direct_lines_private_port_serves_no_stranger(head: Engine, tmp_path: Path,
                                                          start_engine: Callable[..., Engine]) -> None:
    """The line's server listens on a loopback port of its own. A stranger connecting there waits behind
    the line's queued connection and is never answered, before, during and after a head's session; the
    line keeps serving heads meanwhile."""
    trusted = direct_peer(start_engine, tmp_path, "peer-direct", ["127.0.0.0/8"])
    host, port = relay_stats(trusted)["direct"]["server"].rsplit(":", 1)
    hello = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)
    stranger = socket.create_connection((host, int(port)), timeout=5)
    try:
        stranger.sendall(hello)
        endpoint = f"127.0.0.1:{rpc_port(trusted)}"
        load(head, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
        assert len(greedy(head)) == N_TOKENS
        load(head, rpc_servers=None, tensor_split=None)
        eventually(lambda: relay_stats(trusted)["direct"], 10, "the line free again", until=lambda d: d["peer"] is None)
        load(head, rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
        late = socket.create_connection((host, int(port)), timeout=5)  # arrives while a head is served
        late.sendall(hello)
        assert len(greedy(head)) == N_TOKENS
        load(head, rpc_servers=None, tensor_split=None)
        load(head, rpc_servers=[endpoint], tensor_split=[0.5, 0.5])  # the line took this head, not the stranger
        assert len(greedy(head)) == N_TOKENS
        for s in (stranger, late):
            s.settimeout(1.0)
            try:
                answer = s.recv(1)
            except (socket.timeout, ConnectionResetError):  # still queued, or dropped from the queue
                answer = b""
            assert answer == b""  # never a HELLO answer: never accepted
            s.close()
    finally:
        stranger.close()
    assert relay_stats(trusted)["direct"]["error"] is None


def test_a_direct_head_killed_mid_session_frees_the_line(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The head dies with buffers on the peer: the server frees them as for any client that goes, and the
    line takes the next head."""
    trusted = direct_peer(start_engine, tmp_path, "peer-direct", ["127.0.0.0/8"])
    endpoint = f"127.0.0.1:{rpc_port(trusted)}"
    first = start_engine(name="head-1", defaults=HEAD)
    first.notify.wait_for("READY=1", 60)
    load(first, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    reference = greedy(first)
    first.proc.kill()
    first.proc.wait(10)
    eventually(lambda: relay_stats(trusted)["direct"], 10, "the line free again", until=lambda d: d["peer"] is None,
               context=trusted.log)
    second = start_engine(name="head-2", defaults=HEAD)
    second.notify.wait_for("READY=1", 60)
    load(second, model="smollm2-135m", rpc_servers=[endpoint], tensor_split=[0.5, 0.5])
    assert greedy(second) == reference
    assert relay_stats(trusted)["direct"]["handed_over"] >= 2

"""A COMBINE profile applied by a real coordinator to two real engines on loopback (CPU devices):
the switcher sends the head the peer's registered merged port as ``rpc_servers``, the head loads
across it, both engines report their role in their heartbeats, and the coordinator's admin API,
``hydractl engines`` and the console's model show the pair by name; a chat through the front door
is served by the head, never by the model-less peer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from hydrad.wire.rpcclient import RpcClient
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine
from tests.support.wait import eventually
from tui.model import PoolModel

pytestmark = pytest.mark.model

INTERVAL = 0.5
PROFILES: dict[str, Any] = {
    "profiles": {"pair": {"description": "head computes with peer's device",
                          "engines": {"head": {"model": "smollm2-135m", "mode": "COMBINE", "peer": "peer"},
                                      "peer": {"mode": "PEER"}}}},
    "default": "pair",
}


def _relay_ready(engine: Engine) -> bool:
    port = int(yaml.safe_load(engine.config.read_text())["rpc"]["port"])
    with RpcClient(("127.0.0.1", port)) as c:
        return bool(c.info()["rpc"]["ggml_relay"]["ready"])


def test_a_combine_profile_pairs_two_engines_and_the_pool_shows_the_pair(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=INTERVAL)
    try:
        c.wait_ready()
        # the peer first: the head's payload needs the RPC address the peer registers
        peer = start_engine(name="peer", defaults={"n_threads": 1},
                            extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL),
                                   "rpc": {"ggml_threads": 1, "cache_dir": str(tmp_path / "tensor-cache")}})
        eventually(lambda: _relay_ready(peer), 60, "the peer's ggml-RPC relay", ignore=(OSError,), context=peer.log)
        es = c.wait_engines(lambda es: "peer" in es and es["peer"]["alive"] and es["peer"]["rpc"], 60,
                            what="the peer registered")
        peer_rpc = es["peer"]["rpc"]
        assert es["peer"]["role"] == "solo" and es["peer"]["pair"] == []  # nothing borrows its device yet

        head = start_engine(name="head", defaults={"n_threads": 1, "n_ctx": 512, "n_parallel": 1, "temperature": 0},
                            extra={"bus": c.engine_bus(heartbeat_interval_s=INTERVAL)})
        es = c.wait_engines(
            lambda es: "head" in es and es["head"]["stage"] == "ready" and es["head"]["model"] == "smollm2-135m"
            and es["head"]["role"] == "head" and es["peer"]["role"] == "peer"
            # the switcher records its result when its wait for the serving heartbeat resumes,
            # which may come a poll after the heartbeat itself
            and es["head"]["last_configure"] is not None, 180,
            what="head serving smollm2-135m across the peer")
        h, p = es["head"], es["peer"]
        # the coordinator applied the profile on the head's REGISTER, with the peer's real address
        assert h["last_configure"]["ok"] and h["last_configure"]["why"] == "register (pair)", h["last_configure"]
        # each engine's own report, and the pair by name
        assert (h["mode"], h["role"], h["peers"]) == ("combine", "head", [peer_rpc])
        assert (h["pair"], h["pair_peers"], h["pair_heads"]) == (["peer"], ["peer"], [])
        assert (p["mode"], p["role"], p["model"]) == ("combine", "peer", None)
        assert len(p["serving"]) == 1  # the head's connection to the peer's merged port
        assert (p["pair"], p["pair_peers"], p["pair_heads"]) == (["head"], [], ["head"])
        assert head.http.get("/health").json()["peers"] == [peer_rpc]

        # the front door serves a chat on the head (the peer holds no model and is no routing target)
        r = c.http.post("/v1/chat/completions", json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
            "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.headers["X-Hydra-Engine"] == "head"
        assert r.json()["choices"][0]["message"]["content"]
        explained = c.http.post("/admin/route", json={"model": "smollm2-135m",
                                                      "messages": [{"role": "user", "content": "Hi"}]}).json()
        assert explained["engine"] == "head"
        assert explained["rejected"]["peer"].startswith("filter: a COMBINE peer"), explained

        # the console's model of the pool, fed the real admin answer, labels the rows the same way
        pool = PoolModel()
        pool.apply_engines(c.http.get("/admin/engines").json())
        pool.apply_profile(c.http.get("/admin/profile").json())
        assert pool.mode_label(pool.engines["head"]) == "COMBINE head→peer"
        assert pool.mode_label(pool.engines["peer"]) == "COMBINE peer←head"

        # hydractl engines shows the same pair
        out = subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", "engines", c.url], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        assert out.returncode == 0, out.stderr
        assert "COMBINE head→peer" in out.stdout and "COMBINE peer←head" in out.stdout, out.stdout
    finally:
        c.stop()

"""Sibling quants across engines and the prefill/decode split (hydrad/coordinator/pdsplit.py).

Real engines: SmolLM2-135M as shipped (Q4_1) and a Q8_0 sibling made with llama.cpp's own
quantizer; Gemma-3 as the model of another family. Real merged ports, a real coordinator."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from hydrad.wire.rpcclient import RpcClient, RpcError
from tests.support.coordinator import Coordinator
from tests.support.engine import REGISTRY, Engine

pytestmark = pytest.mark.model

Q4, Q8 = "smollm2-135m", "smollm2-135m-q8"
PROMPT = " ".join(f"Fact {i}: the number {i * 7} is written as {i * 7:b} in binary." for i in range(30))


def long_prompt(tag: str, n: int = 60) -> str:
    return f"Notes {tag}. " + " ".join(f"Item {i} of {tag}: the value {i * 13} in base two is {i * 13:b}." for i in range(n))


def rpc_addr(e: Engine) -> tuple[str, int]:
    return "127.0.0.1", int(yaml.safe_load(e.config.read_text())["rpc"]["port"])


def registry_with_q8(tmp_path: Path, q8: Path) -> Path:
    reg = yaml.safe_load(REGISTRY.read_text())
    reg["models"][Q8] = {**reg["models"][Q4], "path": str(q8), "quant": "Q8_0", "size_bytes": q8.stat().st_size,
                         "description": "SmolLM2-135M requantized to Q8_0 (tests)"}
    out = tmp_path / "models-q8.yaml"
    out.write_text(yaml.safe_dump(reg))
    return out


def complete(e: Engine, prompt: str, slot: int, max_tokens: int = 16) -> dict[str, Any]:
    r = e.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                             "id_slot": slot})
    assert r.status_code == 200, r.text
    return r.json()


def test_sibling_quant_state_moves_between_engines_and_another_family_is_refused(
        smollm_q8: Path, gemma_path: Path, tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    reg = registry_with_q8(tmp_path, smollm_q8)
    q8 = start_engine(name="q8", defaults={"model": Q8, "temperature": 0}, extra={"registry": str(reg)})
    q4 = start_engine(name="q4", defaults={"model": Q4, "temperature": 0}, extra={"registry": str(reg)})
    gemma = start_engine(name="gemma", defaults={"model": "gemma3-270m", "temperature": 0})
    for e in (q8, q4, gemma):
        e.wait_ready()
    with RpcClient(rpc_addr(q8)) as a, RpcClient(rpc_addr(q4)) as b:
        info_a, info_b = a.info()["model"], b.info()["model"]
        assert info_a["fingerprint"] != info_b["fingerprint"] and info_a["family"] == info_b["family"]
    n = complete(q8, PROMPT, slot=0, max_tokens=1)["usage"]["prompt_tokens"]
    with RpcClient(rpc_addr(q8)) as a:
        meta, data = a.state_get_bytes(0)
    with RpcClient(rpc_addr(q4)) as b:
        put = b.state_put(1, meta, data)
        assert put["n_tokens"] == n
    cont = complete(q4, PROMPT, slot=1)
    assert cont["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1 and cont["timings"]["prompt_n"] == 1
    words = cont["choices"][0]["text"].split()
    assert len(words) >= 3 and sum(w.isascii() for w in words) >= len(words) - 1  # Q4 decoding Q8's KV: text

    # another family (Gemma-3): refused before a byte is written, the slot keeps its KV
    complete(q4, long_prompt("kept", 10), slot=0, max_tokens=1)
    before = q4.http.get("/slots/0/state/meta").json()["tokens"]
    complete(gemma, PROMPT, slot=0, max_tokens=1)
    with RpcClient(rpc_addr(gemma)) as g:
        g_meta, g_data = g.state_get_bytes(0)
    with RpcClient(rpc_addr(q4)) as b:
        with pytest.raises(RpcError) as refused:
            b.state_put(0, g_meta, g_data)
        assert "another model" in str(refused.value)
        # same layout claimed, another vocabulary and file: refused by the family check
        forged = {**meta, "model": {**meta["model"], "fingerprint": "0" * 32, "family": "f" * 24}}
        with pytest.raises(RpcError) as refused:
            b.state_put(0, forged, data)
        assert "nor a sibling quant" in str(refused.value)
    assert q4.http.get("/slots/0/state/meta").json()["tokens"] == before
    again = complete(q4, long_prompt("kept", 10), slot=0, max_tokens=1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(before) - 1


def test_coordinator_prefills_on_the_fast_sibling_and_decodes_on_the_slow_engine(
        smollm_q8: Path, tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The fast engine (two threads, Q8_0) prefills for the slow one (one thread, small batches, Q4_1), which
    alone serves the requested model, once both have measured their speeds; the answer is the one the slow
    engine gives when the fast engine's prefill state is restored into it by hand."""
    reg = registry_with_q8(tmp_path, smollm_q8)
    c = Coordinator(tmp_path, extra={"registry": str(reg)}, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        common = {"temperature": 0, "n_ctx": 4096, "n_parallel": 2}
        fast = start_engine(name="fast", defaults={"model": Q8, "n_threads": 2, **common},
                            extra={"registry": str(reg), "bus": c.engine_bus(heartbeat_interval_s=0.5)})
        slow = start_engine(name="slow", defaults={"model": Q4, "n_threads": 1, "n_batch": 32, "n_ubatch": 32, **common},
                            extra={"registry": str(reg), "bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_serving({"fast": Q8, "slow": Q4})
        prompt = long_prompt("split")

        def explain() -> dict[str, Any]:
            r = c.http.post("/admin/route", json={"model": Q4, "prompt": prompt, "max_tokens": 16})
            assert r.status_code == 200, r.text
            return r.json()

        assert "not measured" in explain()["split"]["reason"]
        for model, tag in ((Q8, "warm-fast"), (Q4, "warm-slow")):  # each engine measures its own speeds
            r = c.http.post("/v1/completions", json={"model": model, "prompt": long_prompt(tag), "max_tokens": 8,
                                                     "temperature": 0})
            assert r.status_code == 200 and r.headers.get("x-hydra-route") != "split", r.text
        es = c.wait_engines(lambda es: all(es[n]["prefill_tps"] > 0 and es[n]["decode_tps"] > 0
                                           for n in ("fast", "slow")), 20, what="measured speeds")
        assert es["fast"]["kv_family"] == es["slow"]["kv_family"]
        assert es["fast"]["prefill_tps"] > es["slow"]["prefill_tps"], es
        plan = explain()["split"]
        assert plan["plan"] is not None, plan
        assert (plan["plan"]["prefill"], plan["plan"]["decode"]) == ("fast", "slow")
        assert plan["plan"]["total_s"] < plan["plan"]["single_s"]

        r = c.http.post("/v1/completions", json={"model": Q4, "prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.headers["x-hydra-route"] == "split"
        assert (r.headers["x-hydra-prefill-engine"], r.headers["x-hydra-engine"]) == ("fast", "slow")
        body = r.json()
        n = body["usage"]["prompt_tokens"]
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
        event = c.events.wait("split", lambda ev: ev["data"].get("ok") is True)
        assert event["data"]["tokens"] == n and event["data"]["decode"] == "slow"
        assert c.http.post("/admin/route", json={"model": Q4, "prompt": prompt}).json()["split"]["transfers"][
            "transfers"] >= 1

        # by hand: the fast engine prefills, its state goes into the same slot of the slow engine, which decodes
        slot = int(event["data"]["slot"])
        complete(fast, prompt, slot=1, max_tokens=1)
        with RpcClient(rpc_addr(fast)) as a:
            meta, data = a.state_get_bytes(1)
        with RpcClient(rpc_addr(slow)) as b:
            b.state_put(slot, meta, data)
        by_hand = complete(slow, prompt, slot=slot)
        assert by_hand["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
        assert body["choices"][0]["text"] == by_hand["choices"][0]["text"]

        # a short prompt does not pay for a transfer: the slow engine serves it alone
        short = c.http.post("/admin/route", json={"model": Q4, "prompt": "Hi.", "max_tokens": 16}).json()["split"]
        assert short["plan"] is None and "no split pays" in short["reason"], short
        r = c.http.post("/v1/completions", json={"model": Q4, "prompt": "Hi.", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.headers["x-hydra-route"] != "split"
    finally:
        c.stop()


def test_a_state_put_makes_room_in_a_shared_kv_pool_by_evicting_idle_caches(
        smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """One KV pool for all slots (kv_unified, the default) of 1,024 cells: an idle slot's ~670-token cache is
    evicted so that a ~670-token state fits, as a prompt would evict it; the pool never overflows."""
    src = start_engine(name="src", defaults={"model": Q4, "temperature": 0, "n_ctx": 1024, "n_parallel": 2})
    dst = start_engine(name="dst", defaults={"model": Q4, "temperature": 0, "n_ctx": 1024, "n_parallel": 2})
    src.wait_ready()
    dst.wait_ready()
    big = long_prompt("room", 25)
    n = complete(src, big, slot=0, max_tokens=1)["usage"]["prompt_tokens"]
    assert 600 < n < 1024 - 300, n
    complete(dst, long_prompt("other", 25), slot=0, max_tokens=1)  # dst's slot 0 now holds as many cells
    with RpcClient(rpc_addr(src)) as a:
        meta, data = a.state_get_bytes(0)
    with RpcClient(rpc_addr(dst)) as b:
        assert b.state_put(1, meta, data)["n_tokens"] == n
        slots = {s["id"]: s["n_tokens"] for s in b.info()["slots"]}
    assert slots == {0: 0, 1: n}
    cont = complete(dst, big, slot=1)
    assert cont["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1

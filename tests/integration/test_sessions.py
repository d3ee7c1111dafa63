"""Sessions that outlive their engine: the coordinator keeps each session's last turn in the Store
and restores it on whichever engine serves the next turn (hydrad/coordinator/sessions.py).

Real engines (SmolLM2), real merged ports, a real Store on disk, a real coordinator process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from hydrad.coordinator.records import EngineRecord
from hydrad.coordinator.sessions import SessionKeeper, SessionSettings
from hydrad.store import StoreSettings
from hydrad.wire import messages as M
from hydrad.wire.kvdigest import tokens_digest
from hydrad.wire.rpcclient import RpcClient
from tests.integration.test_coordinator import INTERVAL, TWIN, TWIN_PROFILES, Cluster, chat, cluster  # noqa: F401
from tests.support.engine import Engine
from tests.support.wait import eventually, eventually_async

pytestmark = pytest.mark.model

PROMPT = " ".join(f"Fact {i}: the number {i * 7} is written as {i * 7:b} in binary." for i in range(40))
SYSTEM = "You are a terse assistant. " + " ".join(f"Rule {i}: answer about item {i} in one word." for i in range(30))


def rpc_addr(e: Engine) -> str:
    return f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}"


def record(name: str, e: Engine) -> EngineRecord:
    return EngineRecord(name=name, info=M.Register(engine=name, instance="test.1", version="test", rpc=rpc_addr(e)),
                        status=M.EngineStatus())


def done_for(e: Engine, slot: int, *, digest: str | None = None) -> M.Done:
    """What the engine's DONE says about a slot after a turn (read back here over HTTP)."""
    tokens = e.http.get(f"/slots/{slot}/state/meta").json()["tokens"]
    return M.Done(req="gen-test", finish_reason="length", usage=M.UsageInfo(), slot=slot, kv_tokens=len(tokens),
                  kv_hash=digest if digest is not None else tokens_digest(tokens))


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_kept_session_restores_on_another_engine_token_identical(tmp_path: Path, smollm_path: Path, gemma_path: Path,
                                                                 start_engine: Callable[..., Engine], model: str) -> None:
    """Gemma-3 (sliding-window layers) too: a whole state is restored as it was, so its continuation
    is the original engine's and nothing is prefilled again."""
    a = start_engine(name="a", defaults={"model": model, "temperature": 0})
    b = start_engine(name="b", defaults={"model": model, "temperature": 0})
    a.wait_ready()
    b.wait_ready()
    first = a.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 0}).json()
    n_prompt = first["usage"]["prompt_tokens"]
    # B's slot 0 holds the same prompt, prefilled there: both engines then place the restored cells alike
    b.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 0})
    keeper = SessionKeeper(SessionSettings(store=StoreSettings(dir=tmp_path / "store", fsync=False, block_tokens=64)),
                           {"a": record("a", a), "b": record("b", b)})

    async def scenario() -> tuple[Any, Any, Any]:
        # a DONE whose digest no longer matches the slot (another request took it): nothing is kept
        keeper.after_turn("s-moved", "a", done_for(a, 0, digest="0" * 16))
        await eventually_async(lambda: keeper.stats["keep_skipped"] == 1, 30, "the moved slot skipped")
        assert not keeper.has("s-moved")
        keeper.after_turn("s-1", "a", done_for(a, 0))
        await eventually_async(lambda: keeper.has("s-1"), 30, "the session kept")
        on_b = await keeper.restore("s-1", "b")
        on_a = await keeper.restore("s-1", "a")  # the same cells on A too (see test_migration_is_token_identical)
        return on_a, on_b, keeper.store.stats()

    try:
        on_a, on_b, stats = asyncio.run(scenario())
        assert keeper.stats == {"kept": 1, "keep_skipped": 1, "keep_failed": 0, "restored": 2, "restore_failed": 0,
                                "moved": 0}
        assert stats["objects"] == 1
        assert on_a is not None and on_b is not None and on_b.n_tokens == n_prompt
        # slot 0 holds a prompt on both: the restore took an empty idle slot first
        assert on_b.slot == on_a.slot != 0
        ra = a.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "id_slot": on_a.slot}).json()
        rb = b.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "id_slot": on_b.slot}).json()
        assert rb["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1  # no re-prefill on B
        assert rb["choices"][0]["text"] == ra["choices"][0]["text"]

        # a damaged chunk: the object is refused on read and the turn would simply prefill
        chunk = next(p for p in (tmp_path / "store" / "chunks").rglob("*") if p.is_file())
        raw = bytearray(chunk.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        chunk.write_bytes(bytes(raw))
        # the index is on disk: a new keeper (a restarted coordinator) knows the session
        again = SessionKeeper(keeper.settings, {})
        assert again.has("s-1") and not again.has("s-moved")
        again.close()
        assert asyncio.run(keeper.restore("s-1", "b")) is None
        assert keeper.stats["restore_failed"] == 1 and not keeper.has("s-1")  # unusable: forgotten
        b.assert_running()
    finally:
        keeper.close()


def sessions(cl: Cluster) -> dict[str, Any]:
    return cl.c.http.get("/admin/sessions").json()


def test_session_outlives_its_engine_and_the_coordinator(cluster: Callable[..., Cluster]) -> None:
    cl = cluster(profiles=TWIN_PROFILES)
    c = cl.c
    c.wait_serving(TWIN)
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Item 3?"}]
    r1 = chat(c, "smollm2-135m", "", messages=conv, max_tokens=12, session="s-live")
    assert r1.status_code == 200, r1.text
    home = r1.headers["x-hydra-engine"]
    turn1 = r1.json()
    eventually(lambda: sessions(cl)["kept"] >= 1, 30, "the turn kept in the store", context=c.log)
    assert sessions(cl)["store"]["objects"] == 1

    # the coordinator restarts: affinity is gone, the kept session is not
    c.kill()
    c.start_again()
    c.wait_ready()
    c.wait_serving(TWIN)
    conv2 = [*conv, {"role": "assistant", "content": turn1["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Item 4?"}]
    plan = c.http.post("/admin/route", json={"model": "smollm2-135m", "messages": conv2, "session_id": "s-live"}).json()
    assert plan["request"]["stored_tokens"] >= turn1["usage"]["prompt_tokens"], plan["request"]  # the kept turn
    assert plan["candidates"] and all(cand.get("lukewarm") for cand in plan["candidates"]), plan  # restore, not prefill
    r2 = chat(c, "smollm2-135m", "", messages=conv2, max_tokens=8, session="s-live")
    assert r2.status_code == 200, r2.text
    st = sessions(cl)
    cached2 = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert st["restored"] == 1 and cached2 >= turn1["usage"]["prompt_tokens"], (st, r2.json()["usage"])
    second = r2.headers["x-hydra-engine"]
    eventually(lambda: sessions(cl)["kept"] >= 1, 30, "the turn kept in the store", context=c.log)
    kept_before = sessions(cl)["kept"]

    # the engine holding the session dies: the next turn continues on the other one, without re-prefill
    os.kill(cl.engines[second].proc.pid, signal.SIGKILL)
    c.wait_engines(lambda es: not es[second]["alive"], timeout=30)
    assert kept_before >= 1
    conv3 = [*conv2, {"role": "assistant", "content": r2.json()["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Item 5?"}]
    r3 = chat(c, "smollm2-135m", "", messages=conv3, max_tokens=8, session="s-live")
    assert r3.status_code == 200, r3.text
    assert r3.headers["x-hydra-engine"] != second
    usage3 = r3.json()["usage"]
    assert sessions(cl)["restored"] == 2
    assert usage3["prompt_tokens_details"]["cached_tokens"] >= r2.json()["usage"]["prompt_tokens"], usage3
    restored = c.events.wait("session.restored", lambda ev: ev["data"]["engine"] != second)
    assert restored["data"]["session"] == c.events.session_of(r3.json()["id"]) and restored["data"]["tokens"] > 0
    assert home in TWIN


SWITCH_PROFILES = {
    "profiles": {
        "twin": {"engines": {n: {"model": "smollm2-135m", "params": {"n_parallel": 4, "n_ctx": 8192}}
                             for n in ("dev-a", "dev-b")}},
        "mixed": {"engines": {"dev-a": {"model": "gemma3-270m", "params": {"n_parallel": 4, "n_ctx": 8192}},
                              "dev-b": {"model": "smollm2-135m", "params": {"n_parallel": 4, "n_ctx": 8192}}}},
    },
    "default": "twin",
}


def next_turn(conv: list[dict[str, str]], reply: dict[str, Any], question: str) -> list[dict[str, str]]:
    return [*conv, {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": question}]


def test_a_reload_moves_the_session_engine_to_engine(cluster: Callable[..., Cluster]) -> None:
    """A profile switch reloads dev-a with another model while it holds a session: the coordinator
    moves the session's KV to dev-b over the merged ports before the old model goes, and the next
    turn there prefills only the new message."""
    cl = cluster(profiles=SWITCH_PROFILES, engines=("dev-a",))
    c = cl.c
    c.wait_serving({"dev-a": "smollm2-135m"})
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Item 3?"}]
    r1 = chat(c, "smollm2-135m", "", messages=conv, max_tokens=12, session="s-move")
    assert r1.status_code == 200 and r1.headers["x-hydra-engine"] == "dev-a", r1.text
    eventually(lambda: sessions(cl)["kept"] >= 1, 30, "the turn kept", context=c.log)
    a = cl.engines["dev-a"]
    held = [s["id"] for s in a.http.get("/slots").json() if s.get("n_tokens")]
    with RpcClient(rpc_addr(a)) as src:  # the session's KV as dev-a holds it, for the reference below
        original = src.state_get_bytes(held[0])
    cl.engine("dev-b")
    c.wait_serving({"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"})
    switched = c.http.post("/admin/profile", json={"name": "mixed"})
    assert switched.status_code == 200, switched.text
    c.wait_serving({"dev-a": "gemma3-270m", "dev-b": "smollm2-135m"})
    tag = c.events.session_of(r1.json()["id"])  # the session as the events name it
    moved = c.events.wait("session.moved", lambda ev: ev["data"]["session"] == tag)
    assert moved["data"]["dst"] == "dev-b"
    conv2 = next_turn(conv, r1.json(), "Item 4?")
    r2 = chat(c, "smollm2-135m", "", messages=conv2, max_tokens=8, session="s-move")
    assert r2.status_code == 200 and r2.headers["x-hydra-engine"] == "dev-b", r2.text
    usage = r2.json()["usage"]
    kv_tokens = r1.json()["usage"]["prompt_tokens"] + r1.json()["usage"]["completion_tokens"] - 1
    assert usage["prompt_tokens_details"]["cached_tokens"] >= kv_tokens - 1, usage
    st = sessions(cl)
    assert st["moved"] == 1 and st["restored"] == 0, st  # moved engine to engine, not restored from the store
    # the answer is the one the original KV gives: dev-a's bytes put back into the same slot of dev-b (the
    # same cells), the same turn asked there directly
    b, slot = cl.engines["dev-b"], int(moved["data"]["slot"])
    with RpcClient(rpc_addr(b)) as dst:
        dst.state_put(slot, *original)
    direct = b.http.post("/v1/chat/completions", json={"messages": conv2, "max_tokens": 8, "temperature": 0,
                                                      "id_slot": slot})
    assert direct.status_code == 200, direct.text
    assert direct.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert direct.json()["choices"][0]["message"]["content"] == r2.json()["choices"][0]["message"]["content"]
    # and the turn after: the KV the coordinator placed is foreign to dev-b (no engine token here), so the
    # session's turns stay pinned to its slot and keep reusing it
    r3 = chat(c, "smollm2-135m", "", messages=next_turn(conv2, r2.json(), "Item 5?"), max_tokens=8, session="s-move")
    assert r3.status_code == 200 and r3.headers["x-hydra-engine"] == "dev-b", r3.text
    assert r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"], r3.json()["usage"]


def test_drain_of_an_engine_holding_four_sessions(cluster: Callable[..., Cluster]) -> None:
    """SIGTERM (what systemctl stop sends) to the engine holding four sessions: all four continue on
    the other engine without prefilling their conversations again."""
    cl = cluster(profiles=SWITCH_PROFILES, engines=("dev-a",))
    c = cl.c
    c.wait_serving({"dev-a": "smollm2-135m"})
    convs: dict[str, tuple[list[dict[str, str]], dict[str, Any]]] = {}
    for i in range(4):
        conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Item {i}?"}]
        r = chat(c, "smollm2-135m", "", messages=conv, max_tokens=8, session=f"s-{i}")
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == "dev-a", r.text
        convs[f"s-{i}"] = (conv, r.json())
    eventually(lambda: sessions(cl)["kept"] >= 4, 60, "four turns kept", context=c.log)
    cl.engine("dev-b")
    c.wait_serving({"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"})
    cl.engines["dev-a"].proc.send_signal(signal.SIGTERM)
    c.wait_engines(lambda es: not es["dev-a"]["alive"], timeout=60)
    for session, (conv, reply) in convs.items():
        r = chat(c, "smollm2-135m", "", messages=next_turn(conv, reply, "And the next one?"), max_tokens=8,
                 session=session)
        assert r.status_code == 200 and r.headers["x-hydra-engine"] == "dev-b", r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= reply["usage"]["prompt_tokens"], (session, usage)
    st = sessions(cl)
    assert st["moved"] + st["restored"] == 4, st


def test_hydractl_migrate_moves_a_session_by_hand(cluster: Callable[..., Cluster]) -> None:
    from tests.integration.test_hydractl_cluster import hydractl

    cl = cluster(profiles=SWITCH_PROFILES)
    c = cl.c
    c.wait_serving({"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"})
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Item 7?"}]
    r1 = chat(c, "smollm2-135m", "", messages=conv, max_tokens=8, session="s-hand")
    assert r1.status_code == 200, r1.text
    home = r1.headers["x-hydra-engine"]
    other = "dev-b" if home == "dev-a" else "dev-a"
    eventually(lambda: sessions(cl)["kept"] >= 1, 30, "the turn kept", context=c.log)
    done = hydractl("migrate", "--url", c.url, "s-hand", other, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["moved"] and result["from"] == "engine" and result["engine"] == other, result
    r2 = chat(c, "smollm2-135m", "", messages=next_turn(conv, r1.json(), "Item 8?"), max_tokens=8, session="s-hand")
    assert r2.status_code == 200 and r2.headers["x-hydra-engine"] == other, r2.text
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1.json()["usage"]["prompt_tokens"]
    # refusals name what is wrong, and the CLI says it in one line
    unknown = hydractl("migrate", "--url", c.url, "no-such-session", other)
    assert unknown.returncode != 0 and "no-such-session" in unknown.stderr and "Traceback" not in unknown.stderr
    nowhere = c.http.post("/admin/sessions/move", json={"session": "s-hand", "engine": "dev-z"})
    assert nowhere.status_code == 404 and nowhere.json()["error"]["param"] == "engine"
    bad = c.http.post("/admin/sessions/move", content=b"[1, 2")
    assert bad.status_code == 400


BUSY_PROFILES = {"profiles": {"pair": {"engines": {n: {"model": "smollm2-135m", "params": {"n_parallel": 2, "n_ctx": 4096}}
                                                   for n in ("dev-a", "dev-b")}}},
                 "default": "pair"}


def test_a_session_whose_engine_is_overloaded_moves_to_the_idle_one(cluster: Callable[..., Cluster]) -> None:
    """The engine holding a session has a queue of long requests (sent to it directly, pinned to its other
    slot, so the session's KV stays): routing passes it over, and the coordinator moves the session's KV
    to the idle engine over the merged ports (not from the Store) before the turn runs there."""
    cl = cluster(profiles=BUSY_PROFILES, extra={"affinity_margin_s": 0.25})
    c = cl.c
    c.wait_serving({"dev-a": "smollm2-135m", "dev-b": "smollm2-135m"})
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Item 5?"}]
    r1 = chat(c, "smollm2-135m", "", messages=conv, max_tokens=8, session="s-busy")
    assert r1.status_code == 200, r1.text
    home = r1.headers["x-hydra-engine"]
    other = "dev-b" if home == "dev-a" else "dev-a"
    eventually(lambda: sessions(cl)["kept"] >= 1, 30, "the turn kept", context=c.log)
    engine = cl.engines[home]
    held = [s["id"] for s in engine.http.get("/slots").json() if s.get("n_tokens")]
    assert len(held) == 1, engine.http.get("/slots").json()
    spare = 1 - held[0]
    answers: list[int] = []

    def busy() -> None:
        r = engine.http.post("/v1/completions", json={"prompt": "Count: one, two,", "max_tokens": 128, "ignore_eos": True,
                                                      "temperature": 0, "id_slot": spare}, timeout=300)
        answers.append(r.status_code)

    threads = [threading.Thread(target=busy) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        c.wait_engines(lambda es: es[home]["queued"] >= 3, 30, what=f"{home} queueing")
        turn = {"model": "smollm2-135m", "messages": next_turn(conv, r1.json(), "Item 6?"), "max_tokens": 256,
                "temperature": 0, "session_id": "s-busy"}
        # The queue's expected wait is an estimate from the engine's measured decode speed: wait until the
        # coordinator itself judges it past the margin (the queue lasts seconds longer than that takes).
        eventually(lambda: c.http.post("/admin/route", json=turn).json(), 30, "routing to pass the busy engine over",
                   until=lambda d: d["engine"] == other, interval=0.1)
        r2 = c.http.post("/v1/chat/completions", json=turn)
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-hydra-engine"] == other, (r2.headers, c.log()[-3000:])
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1.json()["usage"]["prompt_tokens"]
        tag = c.events.session_of(r2.json()["id"])
        moved = c.events.wait("session.moved", lambda ev: ev["data"]["session"] == tag)
        assert moved["data"]["dst"] == other
        st = sessions(cl)
        assert st["moved"] == 1 and st["restored"] == 0, st
    finally:
        for t in threads:
            t.join(300)
    assert answers == [200] * 6

"""Prefix checkpoints (hydrad/engine/prefixshare.py): a shared system prompt is prefilled once per pool.

Real engines (SmolLM2), a real Store directory shared by two engine processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from hydrad.store import Store
from tests.support.engine import Engine
from tests.support.wait import eventually

pytestmark = pytest.mark.model

SYSTEM = "You are the archive's assistant. " + " ".join(
    f"Record {i}: shelf {i % 7}, box {i * 3}, filed in {1900 + i}." for i in range(70))
BLOCK = 64


def ask(e: Engine, question: str, slot: int | None = None, max_tokens: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                            "max_tokens": max_tokens, "temperature": 0}
    if slot is not None:
        body["id_slot"] = slot
    r = e.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def prefilled(reply: dict[str, Any]) -> int:
    u = reply["usage"]
    return u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]


def test_a_second_slot_copies_the_shared_prefix_instead_of_prefilling(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(name="p", defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 4, "n_ctx": 8192})
    e.wait_ready()
    first = ask(e, "Where is record 3?", slot=0)
    assert first["usage"]["prompt_tokens"] > 1000
    second = ask(e, "Where is record 12?", slot=1)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 1000 and prefilled(second) < 40, second["usage"]  # only the question was prefilled
    # the copied prefix answers as a cold prefill does (a fresh engine, nothing to copy)
    cold = start_engine(name="q", defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 4, "n_ctx": 8192})
    cold.wait_ready()
    fresh = ask(cold, "Where is record 12?", slot=1)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]


def test_sixteen_sessions_on_two_engines_prefill_the_prompt_once_and_store_it_once(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    store_dir = tmp_path / "store"
    prefix = {"store": {"dir": str(store_dir), "block_tokens": BLOCK, "fsync": False}}
    engines = [start_engine(name=n, defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 4,
                                              "n_ctx": 8192}, extra={"prefix": prefix}) for n in ("a", "b")]
    for e in engines:
        e.wait_ready()
    a, b = engines
    replies = [ask(a, "Where is record 0?", slot=0)]  # the one prefill of the system prompt
    shared_len = replies[0]["usage"]["prompt_tokens"] - 20
    replies.append(ask(a, "Where is record 1?", slot=1))  # another conversation shares it: copied and checkpointed
    store = Store(dir=store_dir, block_tokens=BLOCK)
    eventually(lambda: store.stats()["objects"], 30, "the shared prefix checkpointed", context=a.log)
    for i in range(2, 16):
        replies.append(ask(b if i % 2 == 0 else a, f"Where is record {i}?"))
    prompt_tokens = [r["usage"]["prompt_tokens"] for r in replies]
    done = [prefilled(r) for r in replies]
    # the opening request prefilled everything; B's opening one restored block-aligned from the store;
    # every other conversation prefilled only what follows the shared prefix
    assert done[0] == prompt_tokens[0]
    assert all(d < 40 for d in done[1:2] + done[3:]), done
    assert done[2] < 40 + BLOCK, done
    assert sum(done) < prompt_tokens[0] + 16 * 40 + BLOCK
    stats = store.stats()
    assert stats["objects"] == 1, stats  # stored once
    assert store.ls()[0]["n_tokens"] >= shared_len
    for e in engines:
        e.assert_running()


def test_prefix_counters_in_info_and_a_bad_store_refused_at_start(tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    import subprocess
    import sys

    import yaml

    from hydrad.wire.rpcclient import RpcClient

    e = start_engine(name="i", defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 2})
    e.wait_ready()
    ask(e, "Where is record 5?", slot=0)
    ask(e, "Where is record 6?", slot=1)
    with RpcClient(f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}") as c:
        prefix = c.info()["prefix"]
    assert prefix["shared_from_slot"] == 1 and prefix["tokens_shared"] > 1000 and prefix["store"] is None

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the store's directory should be")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"name": "bad", "http": {"port": 0}, "rpc": {"port": 0},
                                   "prefix": {"store": {"dir": str(blocked)}}}))
    out = subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "prefix.store" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_sliding_window_model_says_it_cannot_share_and_claims_nothing(gemma_path: Path,
                                                                        start_engine: Callable[..., Engine]) -> None:
    """Gemma-3 keeps a second, sliding-window cache holding only the last window's cells: its state
    cannot be cut to a prefix, so the second slot prefills (and reports no cached tokens)."""
    import yaml

    from hydrad.wire.rpcclient import RpcClient

    e = start_engine(name="g", defaults={"model": "gemma3-270m", "temperature": 0, "n_parallel": 2, "n_ctx": 8192})
    e.wait_ready()
    ask(e, "Where is record 3?", slot=0)
    second = ask(e, "Where is record 12?", slot=1)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert prefilled(second) == second["usage"]["prompt_tokens"]
    with RpcClient(f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}") as c:
        prefix = c.info()["prefix"]
    assert prefix["not_cut"] == 1 and prefix["shared_from_slot"] == 0, prefix
    assert "sliding-window" in prefix["last_not_cut"]
    third = ask(e, "Where is record 20?", slot=1)  # decided once per model: no second state read
    assert third["usage"]["prompt_tokens"] > 0
    with RpcClient(f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}") as c:
        assert c.info()["prefix"]["not_cut"] == 1

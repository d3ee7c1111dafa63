"""A real engine's slot state through the store and into another engine: engine A prefills, its state
goes into the store (STATE_GET, put), comes back verified (get) and is restored on engine B (STATE_PUT);
B's greedy continuation is token-identical to A's (mirrors test_merged_port::test_migration_is_token_identical)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from hydrad.store import Store
from hydrad.wire.rpcclient import RpcClient
from tests.integration.test_merged_port import PROMPT, rpc_addr
from tests.support.engine import Engine

DEFAULTS = {"model": "smollm2-135m", "temperature": 0, "n_threads": 1, "n_parallel": 1, "n_ctx": 2048}


def test_state_through_the_store_is_token_identical(tmp_path: Path, smollm_path: Path,
                                                    start_engine: Callable[..., Engine]) -> None:
    a = start_engine(name="a", defaults=DEFAULTS)
    b = start_engine(name="b", defaults=DEFAULTS)
    a.wait_ready()
    b.wait_ready()
    prompt = PROMPT[:1500]
    first = a.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "id_slot": 0}).json()
    n_prompt = first["usage"]["prompt_tokens"]
    store = Store(dir=tmp_path / "store", block_tokens=64)
    with RpcClient(rpc_addr(a)) as c:
        meta, data = c.state_get_bytes(0)
    key = store.put(meta, data)
    assert store.stats()["blob_objects"] == 0  # the engine's bytes parse as llama.cpp's KV layout
    got_meta, got = store.get(key)
    assert got == data and got_meta["tokens"] == meta["tokens"]
    with RpcClient(rpc_addr(b)) as c:
        c.state_put(0, got_meta, got)
    # like the migration test: restore on A too, so both hold the state in the same KV cells
    with RpcClient(rpc_addr(a)) as c:
        c.state_put(0, got_meta, got)
    on_a = a.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "id_slot": 0}).json()
    on_b = b.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "id_slot": 0}).json()
    assert on_b["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1  # no re-prefill on B
    assert on_b["choices"][0]["text"] == on_a["choices"][0]["text"]

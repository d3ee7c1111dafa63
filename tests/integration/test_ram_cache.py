"""The host-memory prompt cache (``cache_ram_mib``, llama-server's ``--cache-ram``): a conversation whose
only slot another prompt took comes back from host memory instead of being prefilled again, with the
same answer; off (0, the default), it is prefilled."""

from __future__ import annotations

from typing import Any, Callable

import httpx

from tests.support.engine import Engine

BASE = {"model": "smollm2-135m", "n_threads": 1, "n_ctx": 2048, "n_parallel": 1, "temperature": 0}
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def prompt(seed: int, n: int = 240) -> str:
    return f"Conversation {seed}: " + " ".join(WORDS[(i * seed + i // 3) % len(WORDS)] for i in range(n))


def info(e: Engine) -> dict[str, Any]:
    import yaml

    from hydrad.wire.rpcclient import RpcClient

    with RpcClient(f"127.0.0.1:{yaml.safe_load(e.config.read_text())['rpc']['port']}") as c:
        return c.info()  # type: ignore[no-any-return]


def complete(http: httpx.Client, text: str) -> dict[str, Any]:
    r = http.post("/completion", json={"prompt": text, "n_predict": 8, "temperature": 0, "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_an_overwritten_conversation_comes_back_from_host_memory(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={**BASE, "cache_ram_mib": 64})
    e.wait_ready()
    a, b = prompt(3), prompt(5)
    first = complete(e.http, a)
    n_a = first["tokens_evaluated"]
    complete(e.http, b)  # takes the only slot: a's KV goes to host memory first
    again = complete(e.http, a + " more")  # a's next turn
    assert again["tokens_cached"] >= n_a - 1, again
    assert complete(e.http, a)["content"] == first["content"]  # the restored KV gives the same answer
    ram = info(e)["prefix"]["ram"]
    assert ram["limit_mib"] == 64 and ram["saved"] >= 2 and ram["restored"] >= 1, ram
    assert ram["tokens_restored"] >= n_a - 16 and 0 < ram["bytes"] <= 64 << 20, ram
    # off: the same turns prefill a again
    e.configure(cache_ram_mib=0)
    complete(e.http, b)
    cold = complete(e.http, a + " more")
    assert cold["tokens_cached"] < 64, cold


def test_the_flag_and_the_budget(start_engine: Callable[..., Engine]) -> None:
    """A budget smaller than one conversation's state keeps nothing: the turn prefills, nothing breaks."""
    e = start_engine(defaults={**BASE, "cache_ram_mib": 1})
    e.wait_ready()
    a, b = prompt(7), prompt(11)
    complete(e.http, a)
    complete(e.http, b)
    assert complete(e.http, a + " more")["tokens_cached"] < 64
    assert info(e)["prefix"]["ram"]["too_large"] >= 1
    r = e.http.get("/control/config").json()["params"]["cache_ram_mib"]
    assert r["value"] == 1 and r["tier"] == "T1"

"""Tenants: the keys file, the key check that names a request's tenant, its rate, and the cache
namespace a request's tenant and cache_salt make."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hydrad.common.apikey import with_api_key
from hydrad.common.tenants import Tenant, cache_namespace, read_keys, scoped
from hydrad.common.yamlfile import ConfigError

A_KEY = "alice-key-0123456789"
B_KEY = "bobs-key-0123456789x"


def _keys(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(text)
    return p


def test_a_keys_file_names_its_tenants(tmp_path: Path) -> None:
    (tmp_path / "bob.key").write_text(B_KEY + "\n")
    tenants = read_keys(_keys(tmp_path, f"keys:\n  - {{name: alice, key: {A_KEY}, rate_per_minute: 60}}\n"
                                        "  - {name: bob, key_file: bob.key}\n"))
    assert [(t.name, t.key, t.rate_per_minute) for t in tenants] == [("alice", A_KEY, 60.0), ("bob", B_KEY, 0.0)]


@pytest.mark.parametrize("text, words", [
    ("keys: []\n", "list of 1"),
    (f"keys:\n  - {{name: a, key: {A_KEY}}}\n  - {{name: a, key: {B_KEY}}}\n", "named twice"),
    (f"keys:\n  - {{name: a, key: {A_KEY}}}\n  - {{name: b, key: {A_KEY}}}\n", "same key"),
    ("keys:\n  - {name: a, key: short}\n", "printable ASCII"),
    (f"keys:\n  - {{name: default, key: {A_KEY}}}\n", "only key"),
    (f"keys:\n  - {{name: a, key: {A_KEY}, key_file: x}}\n", "exactly one"),
    (f"keys:\n  - {{name: a, key: {A_KEY}, rate_per_minute: -1}}\n", "rate_per_minute"),
    (f"keys:\n  - {{name: a, key: {A_KEY}, quota: 3}}\n", "optionally"),
    ("keys:\n  - {name: a, key_file: missing.key}\n", "does not exist"),
])
def test_a_bad_keys_file_is_refused_naming_the_entry(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        read_keys(_keys(tmp_path, text))


def test_the_rate_is_a_minute_deep_bucket() -> None:
    t = Tenant("a", A_KEY, rate_per_minute=2)
    assert t.admit(100.0) == 0 and t.admit(100.0) == 0
    wait = t.admit(100.0)
    assert 29 < wait <= 30  # one request a 30 s at 2 a minute
    assert t.admit(130.5) == 0
    assert Tenant("b", B_KEY).admit() == 0  # no rate: never waits


def test_cache_namespaces() -> None:
    assert cache_namespace(None, None) == cache_namespace("default", None) == ""  # one tenant shares, as before
    spaces = {cache_namespace(t, s) for t in ("alice", "bob") for s in (None, "x", "y")}
    assert len(spaces) == 6 and "" not in spaces  # every tenant and salt its own
    assert cache_namespace("alice", "x") == cache_namespace("alice", "x")
    assert cache_namespace(None, "x") == cache_namespace("default", "x") != ""
    assert scoped("", "s1") == "s1" and scoped("ab", "s1") == "ab/s1"


def _call(keys: Any, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen["tenant"] = scope.get("state", {}).get("tenant")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(with_api_key(inner, keys)(scope, receive, send))
    head = sent[0]
    return head["status"], {k.decode(): v.decode() for k, v in head.get("headers", [])}, seen.get("tenant")


def test_the_key_names_the_tenant_and_its_rate_holds() -> None:
    tenants = [Tenant("alice", A_KEY, rate_per_minute=1), Tenant("bob", B_KEY)]
    assert _call(tenants, {"Authorization": f"Bearer {A_KEY}"})[::2] == (200, "alice")
    assert _call(tenants, {"x-api-key": B_KEY})[::2] == (200, "bob")
    assert _call(tenants, {"Authorization": "Bearer nope-nope-nope-nope"})[0] == 401
    status, headers, _ = _call(tenants, {"Authorization": f"bearer {A_KEY}"})  # alice's one a minute is spent
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert _call(tenants, {"x-api-key": B_KEY})[0] == 200  # bob has no rate
    assert _call(A_KEY, {"Authorization": f"Bearer {A_KEY}"})[::2] == (200, "default")  # one key: one tenant

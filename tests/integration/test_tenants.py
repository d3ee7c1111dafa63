"""Tenants on a real engine and through the front door: a second API key cannot learn one byte of
the first key's prompt through ``cached_tokens`` (its slots, pinned or not, its session id, its
conversation), while each key and each ``cache_salt`` still reuses its own prefixes.

The time to the first token still tells a cached prefix from one that is not (documented in
docs/reliability.md); the answers' counters and routing do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

ALICE, BOB = "alice-key-0123456789", "bobs-key-0123456789x"
SECRET = ("Internal memo. The vault code for the north office is 4 8 1 5 9 2 6 and the backup phrase is "
          "blue heron at midnight. Do not share it.")


def _keys(tmp_path: Path) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(f"keys:\n  - {{name: alice, key: {ALICE}}}\n  - {{name: bob, key: {BOB}}}\n")
    return p


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _cached(http: httpx.Client, key: str, prompt: str, **extra: Any) -> int:
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0, **extra}, headers=_as(key))
    assert r.status_code == 200, r.text
    return int(r.json()["tokens_cached"])


@pytest.fixture
def keyed(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> Engine:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 2},
                     extra={"http": {"api_keys_file": str(_keys(tmp_path))}})
    e.wait_ready()
    return e


def test_a_second_key_learns_nothing_of_the_first_keys_prompt(keyed: Engine) -> None:
    http = keyed.http
    assert http.post("/completion", json={"prompt": "x"}).status_code == 401
    assert _cached(http, ALICE, SECRET) == 0
    assert _cached(http, ALICE, SECRET + " Noted.") > 20  # alice's own prefix is reused
    words = SECRET.split(" ")
    probes = [" ".join(words[:n]) for n in (3, 8, 14, 17, 18, len(words))]
    for probe in probes:  # a guess at each length, unpinned and pinned to every slot ...
        for pin in (None, 0, 1):
            for slot in (0, 1):  # ... each time against slots that all hold alice's secret
                _cached(http, ALICE, SECRET, id_slot=slot)
            extra = {} if pin is None else {"id_slot": pin}
            assert _cached(http, BOB, probe, **extra) == 0, (probe, pin)
    chat = http.post("/v1/chat/completions", headers=_as(BOB), json={
        "messages": [{"role": "user", "content": SECRET}], "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # bob's own prefixes are his: his second identical probe reuses his first
    assert _cached(http, BOB, probes[-1] + " Noted.") > 20


def test_a_cache_salt_is_a_partition_of_its_own(keyed: Engine) -> None:
    http = keyed.http
    assert _cached(http, ALICE, SECRET) == 0
    assert _cached(http, ALICE, SECRET, cache_salt="team-1") == 0  # another salt: nothing shared
    assert _cached(http, ALICE, SECRET + " Noted.", cache_salt="team-1") > 20  # the same salt: its own
    assert _cached(http, BOB, SECRET, cache_salt="team-1") == 0  # a salt is no way into another key's cache


@pytest.fixture
def keyed_pool(tmp_path: Path, smollm_path: Path,
               start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    profiles = {"default": "solo", "profiles": {"solo": {"engines": {"solo": {"model": "smollm2-135m"}}}}}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5,
                    extra={"http": {"api_keys_file": str(_keys(tmp_path))}})
    c.wait_ready()
    e = start_engine(name="solo", defaults={"n_ctx": 2048, "n_threads": 1, "n_parallel": 2},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
    yield c, e
    c.stop()


def test_through_the_front_door_a_session_id_and_a_conversation_stay_with_their_key(
        keyed_pool: tuple[Coordinator, Engine]) -> None:
    c, _ = keyed_pool
    conv = [{"role": "system", "content": SECRET}, {"role": "user", "content": "What is the code?"}]

    def ask(key: str, messages: list[dict[str, str]]) -> httpx.Response:
        r = c.http.post("/v1/chat/completions", headers={**_as(key), "X-Session-Id": "s-1"},
                        json={"model": "smollm2-135m", "messages": messages, "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        return r

    first = ask(ALICE, conv)
    follow = [*conv, {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
              {"role": "user", "content": "Say it again."}]
    mine = ask(ALICE, follow)
    assert mine.headers["x-hydra-route"] == "affinity"
    assert mine.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 20
    theirs = ask(BOB, follow)  # the same session id and the same conversation, another key
    assert theirs.headers["x-hydra-route"] != "affinity" and theirs.headers["x-session-id"] == "s-1"
    assert theirs.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    native = c.http.post("/completion", headers=_as(BOB), json={"prompt": SECRET, "n_predict": 1})
    assert native.status_code == 200 and native.json()["tokens_cached"] == 0


def test_a_keys_store_quota_ages_out_its_own_sessions_not_another_keys(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """Alice's keys-file entry holds her to 2 MiB of the pool's KV Store: each of her sessions keeps
    about 1.6 MB (70 tokens of SmolLM2), so her second evicts her first; Bob's, kept before both and
    far inside the store's cap, stays."""
    from hydrad.common.tenants import cache_namespace, store_owner
    from hydrad.store import Store, StoreSettings
    from tests.support.wait import eventually

    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys:\n  - {{name: alice, key: {ALICE}, store_quota_mib: 2}}\n  - {{name: bob, key: {BOB}}}\n")
    profiles = {"default": "solo", "profiles": {"solo": {"engines": {"solo": {"model": "smollm2-135m"}}}}}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5, extra={"http": {"api_keys_file": str(keys)}})
    try:
        c.wait_ready()
        start_engine(name="solo", defaults={"n_ctx": 2048, "n_threads": 1, "n_parallel": 2},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
        settings = StoreSettings(dir=tmp_path / "session-store", fsync=False)

        def listed() -> dict[str, str]:
            return {o["key"]: o["owner"] or "" for o in Store(settings).ls()}

        made: dict[str, str] = {}  # session -> the key of the object its turn was kept as
        for key, session in [(BOB, "s-b1"), (ALICE, "s-a1"), (ALICE, "s-a2")]:
            before = set(listed())
            r = c.http.post("/v1/chat/completions", headers={**_as(key), "X-Session-Id": session}, json={
                "model": "smollm2-135m", "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "system", "content": f"{session}: {SECRET}"},
                             {"role": "user", "content": "What is the code?"}]})
            assert r.status_code == 200, r.text
            now = eventually(listed, 30, f"session {session} kept", until=lambda k, b=before: bool(set(k) - b),
                             interval=0.1)
            (made[session],) = set(now) - before
        left = listed()
        assert made["s-a1"] not in left, "alice's older session outlived her quota"
        assert made["s-a2"] in left and made["s-b1"] in left, "bob's session paid for alice's quota"
        alice, bob = store_owner(cache_namespace("alice", None)), store_owner(cache_namespace("bob", None))
        assert left[made["s-a2"]] == alice and left[made["s-b1"]] == bob and alice != bob
        assert 0 < Store(settings).owned_bytes(alice) <= 2 << 20
    finally:
        c.stop()

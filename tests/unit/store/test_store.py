"""The store on real SmolLM2 states and on synthetic blobs: round trips, dedup, corruption, GC, LRU cap,
longest-prefix lookup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hydrad.store import CorruptChunk, Store, StoreError, StoreSettings
from hydrad.store.settings import default_dir
from tests.unit.store.conftest import fake_meta


def store(tmp_path: Path, **kw) -> Store:
    kw.setdefault("block_tokens", 100)
    return Store(dir=tmp_path / "store", fsync=False, **kw)


@pytest.mark.parametrize("kind", ["trans", "rows"])
def test_round_trip_is_byte_exact_and_prefix_is_shared(tmp_path: Path, real_states, kind: str) -> None:
    s = store(tmp_path)
    (ma, a), (mb, b) = real_states.get("a", kind), real_states.get("b", kind)
    ka, kb = s.put(ma, a), s.put(mb, b)
    assert ka != kb
    got_meta, got = s.get(ka)
    assert got == a and got_meta["tokens"] == ma["tokens"] and got_meta["bytes"] == len(a)
    assert s.get(kb)[1] == b
    st = s.stats()
    # 300 shared tokens + two 100-token tails, of 2 x 400: the ratio is the ideal 500/800 (+ headers)
    assert st["chunk_bytes"] / (len(a) + len(b)) == pytest.approx(500 / 800, abs=0.01)
    assert st["objects"] == 2 and st["blob_objects"] == 0 and st["dedup_ratio"] > 1.5
    # a fresh open sees the same objects and counts
    assert Store(dir=tmp_path / "store", block_tokens=100).stats()["chunks"] == st["chunks"]


@pytest.mark.parametrize("kind", ["trans", "rows"])
def test_a_prefix_ending_inside_a_block_is_shared_from_the_third_session_on(tmp_path: Path, real_states,
                                                                            kind: str) -> None:
    """Blocks of 256: the 300 shared tokens of a, b and c end inside the partial block 256-399. a is cut
    at blocks; b, finding a, is cut at 300 too; c finds the piece 256-300 that b stored. Stored cells:
    256 + 144 (a) + 44 + 100 (b) + 100 (c) = 644 of 1,200, against the ideal 300 + 3 x 100 = 600."""
    s = store(tmp_path, block_tokens=256)
    states = [real_states.get(n, kind) for n in ("a", "b", "c")]
    keys = [s.put(m, d) for m, d in states]
    for key, (_, data) in zip(keys, states):
        assert s.get(key)[1] == data
    assert [s.manifest(k)["split"] for k in keys] == [None, 300, 300]
    st = s.stats()
    assert st["chunk_bytes"] / sum(len(d) for _, d in states) == pytest.approx(644 / 1200, abs=0.01)
    # prefixes are still cut at block boundaries, whatever the split
    assert s.get(keys[1], 256)[1] == s.get(keys[0], 256)[1] == s.get(keys[2], 256)[1]


@pytest.mark.parametrize("kind", ["trans", "rows"])
def test_prefix_of_a_longer_state_is_the_prefix_state_itself(tmp_path: Path, real_states, kind: str) -> None:
    s = store(tmp_path)
    ma, a = real_states.get("a", kind)
    mp, p = real_states.get("p", kind)  # the 300 shared tokens decoded alone
    s.put(ma, a)
    query = mp["tokens"] + [1, 2, 3, 4, 5]
    hit = s.lookup(ma, query)
    assert hit is not None and hit.n_tokens == 300 and not hit.exact
    meta, data = s.get(hit.key, hit.n_tokens)
    assert meta["tokens"] == mp["tokens"] and data == p  # byte for byte what llama.cpp writes for 300 tokens
    assert s.lookup(ma, ma["tokens"]).exact
    assert s.lookup(ma, query[:99]) is None
    other = dict(ma, cache_type_k="q8_0")
    assert s.lookup(other, query) is None  # another KV identity never matches


def test_flipped_byte_is_refused_on_read_and_found_by_verify(tmp_path: Path, real_states) -> None:
    s = store(tmp_path)
    ma, a = real_states.get("a", "trans")
    key = s.put(ma, a)
    victim = s._summarize(s.manifest(key), 0).chunks[5][0]
    path = s.chunks.path(victim)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunk) as exc:
        s.get(key)
    assert victim in str(exc.value) and "damaged" in str(exc.value)
    report = s.verify()
    assert not report["ok"] and report["bad_objects"] == [key]
    assert [b["chunk"] for b in report["bad_chunks"]] == [victim]
    # putting the same bytes again heals the chunk
    s.put(ma, a)
    assert s.get(key)[1] == a and s.verify()["ok"]


def test_missing_chunk_is_refused(tmp_path: Path) -> None:
    s = store(tmp_path, blob_chunk_bytes=4096)
    key = s.put(fake_meta([1, 2, 3]), os.urandom(20000))
    name = s._summarize(s.manifest(key), 0).chunks[0][0]
    s.chunks.remove(name)
    with pytest.raises(CorruptChunk, match="missing"):
        s.get(key)
    assert s.verify()["bad_chunks"][0]["why"] == "missing"


def test_unparseable_state_is_stored_as_blob(tmp_path: Path) -> None:
    s = store(tmp_path, blob_chunk_bytes=4096)
    data = os.urandom(10000)
    key = s.put(fake_meta([5] * 10), data)
    assert s.get(key)[1] == data
    assert s.stats()["blob_objects"] == 1 and s.ls()[0]["layout"] == "blob"
    with pytest.raises(StoreError, match="prefix"):
        s.get(key, 5)


def test_gc_keeps_every_referenced_chunk(tmp_path: Path) -> None:
    s = store(tmp_path, blob_chunk_bytes=4096)
    shared = os.urandom(8192)
    k1 = s.put(fake_meta([1]), shared + os.urandom(8192))
    k2 = s.put(fake_meta([2]), shared + os.urandom(8192))
    orphan = s.chunks.write(b"nobody uses this")
    (s.dir / "tmp" / "x.tmp").write_bytes(b"half")
    s.delete(k1)
    res = s.gc()
    assert res["removed_tmp"] == 1 and res["removed_chunks"] == 1  # only the orphan: k1's own went with it
    assert not s.chunks.path(orphan).exists()
    assert s.get(k2)[0]["tokens"] == [2] and s.verify()["ok"]
    s.gc()
    assert s.get(k2)[1][:8192] == shared


def test_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    s = store(tmp_path, blob_chunk_bytes=4096, cap_bytes=3 * 20000 + 5000)
    keys = []
    for i in range(3):
        keys.append(s.put(fake_meta([i]), os.urandom(20000)))
        time.sleep(0.01)
    s.get(keys[0])  # now keys[1] is the least recently used
    time.sleep(0.01)
    s.put(fake_meta([9]), os.urandom(20000))
    left = {o["key"] for o in s.ls()}
    assert keys[1] not in left and keys[0] in left and keys[2] in left
    assert s.stats()["used_bytes"] <= s.settings.cap_bytes
    with pytest.raises(StoreError, match="cap"):
        s.put(fake_meta([10]), os.urandom(100000))


def test_a_tenant_past_its_quota_evicts_its_own_objects_not_another_tenants(tmp_path: Path) -> None:
    """Alice's quota holds two of her objects: her third evicts her oldest; Bob's older object, well
    inside the store's cap, stays; one object larger than her quota is refused by name."""
    s = store(tmp_path, blob_chunk_bytes=4096, cap_bytes=10 << 20)
    quota = 2 * 20000 + 5000
    bob = s.put(fake_meta([100]), os.urandom(20000), owner="b0b", quota=quota)
    time.sleep(0.01)
    alice = []
    for i in range(3):
        alice.append(s.put(fake_meta([i]), os.urandom(20000), owner="a11ce", quota=quota))
        time.sleep(0.01)
    left = {o["key"]: o["owner"] for o in s.ls()}
    assert alice[0] not in left and alice[1] in left and alice[2] in left
    assert left[bob] == "b0b", "another tenant's object was evicted for alice's quota"
    assert s.owned_bytes("a11ce") <= quota
    shared = s.put(fake_meta([7]), os.urandom(20000))  # no owner, no quota: only the cap applies
    assert left.keys() <= {o["key"] for o in s.ls()} | {alice[0]} and shared in {o["key"] for o in s.ls()}
    with pytest.raises(StoreError, match="quota"):
        s.put(fake_meta([8]), os.urandom(quota + 1), owner="a11ce", quota=quota)
    assert Store(s.settings).objects[alice[2]].owner == "a11ce", "the owner is read back from the manifest"


def test_object_being_read_is_never_evicted(tmp_path: Path) -> None:
    s = store(tmp_path, blob_chunk_bytes=4096, cap_bytes=45000)
    k = s.put(fake_meta([1]), os.urandom(20000))
    s._reading[k] += 1  # as get() marks it while reading
    s.put(fake_meta([2]), os.urandom(20000))
    s.put(fake_meta([3]), os.urandom(20000))
    assert k in {o["key"] for o in s.ls()}


def test_settings_are_typed_and_default_to_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert default_dir("p1") == Path("/dev/shm/hydra-store/p1")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert StoreSettings(pool="p1").location() == Path("/run/user/1000/hydra-store/p1")
    with pytest.raises(ValueError):
        StoreSettings(pool="../elsewhere")
    with pytest.raises(ValueError):
        StoreSettings(block_tokens=0)
    with pytest.raises(ValueError):
        StoreSettings(colour="blue")
    assert StoreSettings.model_fields["cap_bytes"].description

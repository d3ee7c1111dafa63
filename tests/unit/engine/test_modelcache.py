"""The fetched models' cache: least recently used first, never a model in use, never the operator's files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hydrad.engine.modelcache import ModelCache, QuotaExceeded, part_path

MIB = 1 << 20


def _file(d: Path, name: str, size: int) -> Path:
    p = d / name
    p.write_bytes(b"\0" * size)
    return p


def test_make_room_deletes_the_least_recently_used_fetched_files_first(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, 10 * MIB)
    for name in ("a.gguf", "b.gguf", "c.gguf"):
        cache.add(_file(tmp_path, name, 3 * MIB), 3 * MIB)
        time.sleep(0.01)
    cache.touch(tmp_path / "a.gguf")  # a is now the most recently used: b, then c, go first
    hand = _file(tmp_path, "hand.gguf", 20 * MIB)  # the operator's: neither counted nor deleted
    deleted = cache.make_room(4 * MIB, tmp_path / "d.gguf", in_use=[])
    assert deleted == ["b.gguf"]
    assert sorted(cache.entries()) == ["a.gguf", "c.gguf"] and hand.is_file()
    deleted = cache.make_room(7 * MIB, tmp_path / "d.gguf", in_use=[tmp_path / "c.gguf"])
    assert deleted == ["a.gguf"]  # c is in use: kept although older


def test_stale_partial_files_go_before_fetched_models_and_the_own_partial_stays(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, 6 * MIB)
    cache.add(_file(tmp_path, "a.gguf", 3 * MIB), 3 * MIB)
    stale = _file(tmp_path, part_path(tmp_path / "old.gguf").name, 2 * MIB)
    own = _file(tmp_path, part_path(tmp_path / "new.gguf").name, 1 * MIB)
    assert cache.make_room(3 * MIB, tmp_path / "new.gguf", in_use=[]) == [stale.name]
    assert own.is_file() and (tmp_path / "a.gguf").is_file()


def test_no_room_without_deleting_a_model_in_use_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, 4 * MIB)
    cache.add(_file(tmp_path, "a.gguf", 3 * MIB), 3 * MIB)
    with pytest.raises(QuotaExceeded, match="models_cache_gib"):
        cache.make_room(2 * MIB, tmp_path / "b.gguf", in_use=[tmp_path / "a.gguf"])
    assert (tmp_path / "a.gguf").is_file()


def test_an_unreadable_list_counts_nothing_as_fetched(tmp_path: Path) -> None:
    _file(tmp_path, "a.gguf", 3 * MIB)
    (tmp_path / ".hydra-fetched.json").write_text("{not json")
    cache = ModelCache(tmp_path, 1 * MIB)
    assert cache.entries() == {}
    assert cache.make_room(1 * MIB, tmp_path / "b.gguf", in_use=[]) == []
    assert (tmp_path / "a.gguf").is_file()

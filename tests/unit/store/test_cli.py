"""``hydractl store stats|ls|verify|gc`` on a store directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hydrad.cli import hydractl
from hydrad.store import Store
from tests.unit.store.conftest import fake_meta


def test_store_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "s"
    s = Store(dir=d, fsync=False, blob_chunk_bytes=4096)
    key = s.put(fake_meta([1, 2, 3]), os.urandom(9000))
    assert hydractl.main(["store", "stats", "--dir", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 1
    assert hydractl.main(["store", "ls", "--dir", str(d)]) == 0
    assert key in capsys.readouterr().out
    assert hydractl.main(["store", "verify", "--dir", str(d)]) == 0
    assert "all good" in capsys.readouterr().out
    chunk = s._summarize(s.manifest(key), 0).chunks[0][0]
    s.chunks.path(chunk).write_bytes(b"bad")
    assert hydractl.main(["store", "verify", "--dir", str(d)]) == 2
    out = capsys.readouterr().out
    assert "DAMAGED" in out and chunk in out and key in out
    (d / "tmp" / "junk.tmp").write_bytes(b"x")
    assert hydractl.main(["store", "gc", "--dir", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed_tmp"] == 1


def test_missing_store_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hydractl.main(["store", "stats", "--dir", str(tmp_path / "none")]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()

"""Each pool has a Store directory of its own (``<root>/hydra-store/<pool>``, mode 0700), which its
coordinator and its engines derive alike; another pool on the host cannot see its objects, and a
directory another user could read or replace is refused. Real stores on real files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.engine.settings import EngineSettings
from hydrad.store import Store, StoreError
from tests.support.engine import REPO
from tests.unit.store.conftest import fake_meta


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory of the test's own standing in for the user's tmpfs."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run / "hydra-store"


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_two_pools_cannot_see_each_others_objects(root: Path) -> None:
    a, b = Store(pool="pool-a", fsync=False, block_tokens=4), Store(pool="pool-b", fsync=False, block_tokens=4)
    assert (a.dir, b.dir) == (root / "pool-a", root / "pool-b")
    assert _mode(root) == _mode(a.dir) == _mode(b.dir) == 0o700
    tokens = list(range(12))
    key = a.put(fake_meta(tokens), os.urandom(5000))
    assert [o["key"] for o in a.ls()] == [key] and a.lookup(fake_meta(tokens), tokens) is not None
    assert b.ls() == [] and b.lookup(fake_meta(tokens), tokens) is None
    with pytest.raises(StoreError):
        b.get(key)
    assert not any((b.dir / "chunks").iterdir())
    # a second process of pool a (another engine, the coordinator) finds the object
    assert [o["key"] for o in Store(pool="pool-a", fsync=False, block_tokens=4).ls()] == [key]


def test_a_coordinator_and_its_engines_derive_one_pool(root: Path) -> None:
    coordinator = CoordinatorSettings(bus="tcp://127.0.0.1:9600")
    engine = EngineSettings(name="gpu0", bus={"endpoint": "tcp://gpu-host:9600"}, prefix={"store": {}})
    other = CoordinatorSettings(bus="tcp://127.0.0.1:9700")
    assert coordinator.pool == engine.pool == "bus-9600" and other.pool == "bus-9700"
    assert engine.prefix.store is not None
    assert coordinator.sessions.store.location() == engine.prefix.store.location() == root / "bus-9600"
    assert other.sessions.store.location() == root / "bus-9700"
    named = CoordinatorSettings(pool="staging", bus="tcp://127.0.0.1:9600")
    assert named.sessions.store.location() == root / "staging"
    alone = EngineSettings(name="solo", prefix={"store": {}})  # no coordinator: the engine's own
    assert alone.prefix.store is not None and alone.prefix.store.location() == root / "solo"
    ipc = CoordinatorSettings(bus="ipc:///run/hydra/bus.sock")
    assert ipc.pool == EngineSettings(bus={"endpoint": "ipc:///run/hydra/bus.sock"}).pool
    assert ipc.pool is not None and ipc.pool.startswith("ipc-")


def test_a_pool_directory_others_could_open_or_replace_is_refused(root: Path, tmp_path: Path) -> None:
    root.mkdir(mode=0o700)
    (root / "open").mkdir()
    os.chmod(root / "open", 0o755)
    with pytest.raises(StoreError, match="may be opened by other users"):
        Store(pool="open")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (root / "linked").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="not a directory"):
        Store(pool="linked")
    if os.geteuid() == 0:  # only root can give a directory to another user
        (root / "theirs").mkdir(mode=0o700)
        os.chown(root / "theirs", 65534, 65534)
        with pytest.raises(StoreError, match="belongs to user 65534"):
            Store(pool="theirs")
        os.chown(root, 65534, 65534)  # the root itself another user's (and not sticky): they could swap pools
        with pytest.raises(StoreError, match="could replace"):
            Store(pool="fresh")
    assert not list(elsewhere.iterdir())  # nothing was written through the link


def test_hydractl_store_opens_a_pool_by_name(root: Path) -> None:
    s = Store(pool="bus-9600", fsync=False, block_tokens=4)
    s.put(fake_meta(list(range(8))), os.urandom(3000))
    out = subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", "store", "stats", "--pool", "bus-9600", "--json"],
                         capture_output=True, text=True, cwd=str(REPO), env=dict(os.environ), timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"objects": 1' in out.stdout and str(root / "bus-9600") in out.stdout

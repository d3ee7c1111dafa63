"""A writer killed with SIGKILL at random points never leaves a manifest that names a missing or bad
chunk; reopening and GC clean up what it left in tmp/."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hydrad.store import Store
from tests.support.engine import REPO

WRITER = """
import os, sys
from hydrad.store import Store
s = Store(dir=sys.argv[1], block_tokens=4, blob_chunk_bytes=4096)
i = 0
while True:
    # shared prefix bytes plus a fresh tail: some chunks are reused, some new
    s.put({"model": {"arch": "fake"}, "tokens": [i]}, b"P" * 16384 + os.urandom(30000))
    i += 1
"""


@pytest.mark.slow  # six writers started and killed: about 10 s
def test_sigkill_during_writes_leaves_no_dangling_manifest(tmp_path: Path) -> None:
    d = tmp_path / "store"
    rng = random.Random(7)
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], cwd=REPO)
        # the kill lands mid-write, not mid-import: on a loaded machine the interpreter alone can take
        # longer than the random pause, so wait for this writer's first object (then a random pause)
        before = len(list((d / "manifests").glob("*.json"))) if (d / "manifests").is_dir() else 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and (
                not (d / "manifests").is_dir() or len(list((d / "manifests").glob("*.json"))) <= before):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.8))
        p.send_signal(signal.SIGKILL)
        p.wait()
        s = Store(dir=d, block_tokens=4)
        report = s.verify()
        assert report["bad_chunks"] == [] and report["bad_manifests"] == {}, report
        for key in list(s.objects):
            s.get(key)  # every chunk present and verified
    assert len(s.objects) > 0
    s.gc()
    assert os.listdir(d / "tmp") == [] and s.verify()["ok"] and s.verify()["unreferenced_chunks"] == 0

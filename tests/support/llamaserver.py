"""llama.cpp's own llama-server, built from the vendored tree (scripts/build_llama_server), started for a
test that compares an answer's shape or values with hydrad's. A test without the build is skipped with
the reason: nothing is compiled here."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

import httpx
import pytest

from tests.support.engine import REPO, free_port, terminate


def binary() -> str:
    """The cached llama-server's path; skips the test when this machine has no build."""
    found = subprocess.run([str(REPO / "scripts" / "build_llama_server"), "-q", "--no-build"], capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    if found.returncode == 3:
        pytest.skip("no llama-server build in this machine's cache (scripts/build_llama_server makes one)")
    assert found.returncode == 0, found.stderr
    return found.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def running(model: Path, *args: str, timeout: float = 120) -> Iterator[httpx.Client]:
    """llama-server on ``model`` with ``args`` (besides -m, --host, --port), as a client of its port,
    once /health answers 200; stopped on leaving."""
    port = free_port()
    log = tempfile.TemporaryFile()  # its log, read back only if it fails to start (a pipe could fill and block it)
    proc = subprocess.Popen([binary(), "-m", str(model), *args, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")[-2000:]
                raise AssertionError(f"llama-server exited with {proc.returncode}: {err}")
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
        yield client
    finally:
        client.close()
        terminate(proc, 10)
        log.close()


def start_args(*, n_ctx: int, extra: Sequence[str] = ()) -> list[str]:
    """The flags the tests start it with: one slot, one thread, no prompt cache across requests."""
    return ["-c", str(n_ctx), "-np", "1", "-t", "1", "--cache-ram", "0", *extra]

"""A real headless Chromium for a test, driven over the Chrome DevTools protocol (a websocket): open a page,
run script in it, wait for what it shows. A test without a chromium binary is skipped with the reason
(scripts/setup installs Debian's chromium when it runs as root)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.support.engine import terminate

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def binary() -> str:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium binary on this machine (scripts/setup installs Debian's chromium as root; "
                "or: apt-get install -y chromium)")


class Chromium:
    """One headless Chromium with a profile of its own under ``tmp`` (its localStorage lives there), and
    one tab (a DevTools page target) to drive."""

    def __init__(self, tmp: Path, timeout: float = 30.0) -> None:
        from websockets.sync.client import connect

        profile = tmp / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self._log = open(tmp / "chromium.log", "wb")
        argv = [binary(), "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--no-proxy-server", "about:blank"]
        if os.geteuid() == 0:  # Chromium's sandbox refuses root
            argv.insert(1, "--no-sandbox")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (active.is_file() and len(active.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"chromium did not open its DevTools port:\n{(tmp / 'chromium.log').read_text()}")
            time.sleep(0.05)
        port = int(active.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=timeout).json()
        page = next(t for t in targets if t.get("type") == "page")
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout))
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """One DevTools command and its result (events meanwhile are skipped)."""
        cid = next(self._ids)
        self.ws.send(json.dumps({"id": cid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == cid:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str, timeout: float = 30.0) -> Any:
        """The value of ``expression`` in the page (awaited when it is a promise)."""
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                        timeout)
        if "exceptionDetails" in out:
            raise AssertionError(f"{expression[:200]}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate to ``url`` and wait for its document to have loaded."""
        self.call("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete' && location.href !== 'about:blank'", timeout, f"{url} to load")

    def wait(self, expression: str, timeout: float = 60.0, what: str = "", until: Callable[[Any], bool] = bool) -> Any:
        """Poll ``expression`` until ``until`` holds for its value; that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if until(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or expression}: last {value!r}")
            time.sleep(0.05)

    def close(self) -> None:
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()
        terminate(self.proc, 10)  # type: ignore[arg-type]
        self._log.close()

"""Start a real hydra-coordinator subprocess for a test: free ports, temp YAML, own NOTIFY_SOCKET,
plus a subscriber that collects what it publishes on the PUB socket.

Like a real pool, the bus has a token by default (``<tmp>/bus.token``): engines join with
:meth:`Coordinator.engine_bus` as their ``bus`` section, which names the endpoint and the token
file. The events socket has its token (``<tmp>/events.token``), which the collector presents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
import yaml
import zmq

from hydrad.common import tokenfile
from hydrad.wire import eventsauth
from tests.support.engine import REGISTRY, NotifyListener, free_port, terminate
from tests.support.wait import eventually


class Events:
    """A SUB socket on its own thread (the socket never leaves it) collecting (topic, event) pairs."""

    def __init__(self, endpoint: str, token: str | None = None, curve_server_key: str | None = None) -> None:
        self.endpoint = endpoint
        self.token = token
        self.curve_server_key = curve_server_key
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.frames: list[list[bytes]] = []  # every message as it arrived
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        self._ready.wait(5)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        eventsauth.present(sock, self.token, self.curve_server_key)
        sock.connect(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(100):
                    frames = sock.recv_multipart()
                    self.frames.append(frames)
                    topic, body = frames
                    self.items.append((topic.decode(), json.loads(body)))
        finally:
            sock.close(0)
            ctx.term()

    def of(self, prefix: str) -> list[dict[str, Any]]:
        return [ev for topic, ev in list(self.items) if topic.startswith(prefix)]

    def wait(self, prefix: str, pred: Callable[[dict[str, Any]], bool] = lambda _: True,
             timeout: float = 30.0) -> dict[str, Any]:
        return eventually(lambda: next((ev for ev in self.of(prefix) if pred(ev)), None), timeout,
                          f"a matching {prefix!r} event",
                          context=lambda: f"topics seen: {sorted({t for t, _ in list(self.items)})}")

    def session_of(self, req: str, timeout: float = 10.0) -> str:
        """The tag the events give the session of request ``req`` (a response's ``id``): events carry a
        keyed hash of each session id, never the id (hydrad/coordinator/eventsdoor.py)."""
        route = self.wait("route", lambda ev: ev["data"].get("req") == req, timeout)
        return str(route["data"]["session"])

    def close(self) -> None:
        self._stop.set()
        self._t.join(2)


class Coordinator:
    def __init__(self, tmp: Path, profiles: dict[str, Any] | str | Path | None = None, default_profile: str | None = None,
                 heartbeat_interval_s: float = 0.5, extra: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, curve: tuple[str, str] | None = None,
                 bus_token: bool = True, admin_token: bool = False, request_stream: bool = True,
                 wrap: Sequence[str] = ()) -> None:
        """``wrap``: a command prefix the daemon runs under (``prlimit ... --``)."""
        self.wrap = list(wrap)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bus = f"tcp://127.0.0.1:{free_port()}"
        self.events_endpoint = f"tcp://127.0.0.1:{free_port()}"
        cfg: dict[str, Any] = {"http": {"host": "127.0.0.1", "port": self.port}, "bus": self.bus,
                               "events": self.events_endpoint, "heartbeat_interval_s": heartbeat_interval_s,
                               "liveness": 3, "registry": str(REGISTRY), "first_token_timeout_s": 60,
                               "token_timeout_s": 30, "load_timeout_s": 120,
                               "state_dir": str(tmp / "coordinator-state"),
                               "sessions": {"store": {"dir": str(tmp / "session-store"), "fsync": False}}}
        if curve is not None:  # (public, secret) Z85 keys: the bus and events are encrypted
            cfg["bus"] = {"endpoint": self.bus, "curve_public_key": curve[0], "curve_secret_key": curve[1]}
        # The request path beside the bus (hydrad/coordinator/reqstream.py), on as in a default pool. At a
        # port of its own rather than the default's bus port + 2, which another test may have just been
        # handed by free_port() and not yet bound. Not beside CURVE (as the default: it is not encrypted).
        self.request_stream: str | None = None
        if request_stream and curve is None:
            self.request_stream = f"127.0.0.1:{free_port()}"
            cfg["bus"] = {"endpoint": self.bus, "request_stream": self.request_stream}
        elif curve is None:
            cfg["bus"] = {"endpoint": self.bus, "request_stream": "off"}
        self.token_file: Path | None = None
        if bus_token:
            self.token_file = tmp / "bus.token"
            tokenfile.write_token(self.token_file)
            cfg["bus_token_file"] = str(self.token_file)
        self.events_token_file = tmp / "events.token"
        self.events_token = tokenfile.write_token(self.events_token_file)
        cfg["events_token_file"] = str(self.events_token_file)
        self.admin_token: str | None = None
        if admin_token:
            admin_file = tmp / "admin.token"
            self.admin_token = tokenfile.write_token(admin_file)
            cfg["admin_token_file"] = str(admin_file)
        if isinstance(profiles, dict):
            path = tmp / "profiles.yaml"
            path.write_text(yaml.safe_dump(profiles))
            cfg["profiles"] = str(path)
        elif profiles is not None:
            cfg["profiles"] = str(profiles)
        if default_profile is not None:
            cfg["default_profile"] = default_profile
        for key, value in (extra or {}).items():  # a section (http, sessions, ...) is merged, not replaced
            cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        self.config = tmp / "coordinator.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.notify = NotifyListener(tmp / "notify-coordinator.sock")
        self.log_path = tmp / "coordinator.log"
        self._log = open(self.log_path, "wb")
        self._env = dict(os.environ, NOTIFY_SOCKET=str(self.notify.path), PYTHONUNBUFFERED="1", **(env or {}))
        self._cwd = tmp
        self.events = Events(self.events_endpoint, self.events_token, curve[0] if curve is not None else None)
        self.proc = self._spawn()
        self.http = httpx.Client(base_url=self.url, timeout=120, headers=tokenfile.bearer(self.admin_token))

    def engine_bus(self, **extra: Any) -> dict[str, Any]:
        """An engine's ``bus`` section for this coordinator: endpoint, token file, and ``extra``."""
        out: dict[str, Any] = {"endpoint": self.bus, **extra}
        if self.token_file is not None:
            out["token_file"] = str(self.token_file)
        return out

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self.wrap, sys.executable, "-m", "hydrad.coordinator.daemon", "--config", str(self.config)],
                                stdout=self._log, stderr=subprocess.STDOUT, env=self._env, cwd=str(self._cwd))

    def kill(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Stop the process only (same ports and config for :meth:`start_again`); the PUB collector stays."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def start_again(self) -> None:
        """A new process on the same config and ports (after :meth:`kill`); its log is appended."""
        assert self.proc.poll() is not None, "the coordinator still runs"
        self.notify.messages.clear()
        self.proc = self._spawn()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            self.assert_running()
            return "READY=1" in self.notify.lines()

        eventually(ready, timeout, "the coordinator's READY=1", context=self.log)

    def assert_running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"coordinator exited with {self.proc.returncode}:\n{self.log()}")

    def engines(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.http.get("/admin/engines").json()["engines"]}

    def wait_engines(self, pred: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 60.0,
                     what: str = "engines") -> dict[str, dict[str, Any]]:
        def engines() -> dict[str, dict[str, Any]]:
            self.assert_running()
            return self.engines()

        return eventually(engines, timeout, what, until=pred, interval=0.05, context=lambda: self.log()[-5000:])

    def wait_serving(self, wanted: dict[str, str], timeout: float = 90.0) -> dict[str, dict[str, Any]]:
        """Until every named engine is alive, ready and serving the given model."""
        return self.wait_engines(
            lambda es: all(n in es and es[n]["alive"] and es[n]["stage"] == "ready" and es[n]["model"] == m
                           for n, m in wanted.items()), timeout, what=f"serving {wanted}")

    def stop(self, timeout: float = 20.0) -> int:
        if self._log.closed:
            return self.proc.returncode
        terminate(self.proc, timeout)
        self.http.close()
        self.events.close()
        self.notify.close()
        self._log.close()
        return self.proc.returncode

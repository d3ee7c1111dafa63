"""A pool to hurt: one hydra-coordinator and two hydrad engines serving SmolLM2, real processes on
loopback, each in its own process group, restartable on the same config and ports.

The reliability program kills these with SIGKILL, freezes them with SIGSTOP and floods them; after a
kill it restarts the daemon itself, as systemd's ``Restart=`` would, with the same config (so the
same name and ports). Every process is started in a new session so that :meth:`FaultPool.close` can
kill whole process groups, whatever state a scenario left them in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

from hydrad.common import tokenfile
from tests.support.engine import REGISTRY, REPO, free_port, models_dir
from tests.support.netpartition import Bed, NetLink, Node

MODEL = "smollm2-135m"
ENGINES = ("rel-a", "rel-b")
PROFILE = "twin"
ALT_PROFILE = "twin-read"
"""The same model read into memory (``use_mmap`` off) with a larger context: a switch between the two
profiles reloads the model on every engine (a load, not just a context rebuild), and each engine's
``n_ctx`` says which of the two it serves."""
ALT_CTX_FACTOR = 1.5
HEARTBEAT_S = 0.5
LIVENESS = 3
AS_LIMIT = 8 << 30  # address space per daemon: a runaway allocation kills the daemon, not the machine


class Daemon:
    """One restartable process: the same command line every start, stdout+stderr appended to a log."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} still runs"
        with open(self.log_path, "ab") as log:
            env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
            env.pop("NOTIFY_SOCKET", None)
            self.proc = subprocess.Popen(["prlimit", f"--as={AS_LIMIT}", "--", *self.argv], stdout=log,
                                         stderr=subprocess.STDOUT, cwd=str(self.cwd), env=env, start_new_session=True)
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill9(self) -> None:
        """SIGKILL and reap (bounded)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (after SIGCONT, in case it is frozen), then SIGKILL of the whole group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGCONT)
                os.killpg(self.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill9()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.05) -> tuple[Any, float]:
    """Poll ``probe`` until it returns something truthy; (that value, seconds waited). TimeoutError after
    ``timeout`` (every wait of the program is bounded)."""
    t0 = time.monotonic()
    while True:
        try:
            got = probe()
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            got = None
        if got:
            return got, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


class FaultPool:
    """Coordinator + engines ``rel-a`` and ``rel-b`` (one llama.cpp thread each, ``n_parallel`` slots)."""

    def __init__(self, root: Path | None = None, n_parallel: int = 4, n_ctx: int = 4096,
                 isolate: dict[str, NetLink] | None = None, bed: Bed | None = None) -> None:
        """``isolate``: engines that run in a network namespace of their own, reached over its veth link
        (the partition scenario cuts it); the coordinator's bus then listens on every address. ``bed``: a
        multi-host test bed with nodes ``coordinator`` and one per engine, every daemon in its node's
        namespace, the engines reaching the coordinator over their links (through the link's relay where
        the bed shapes links that way), the clients (this process) over the bed's bridge."""
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="hydra-reliability-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.store_dir = self.root / "session-store"
        token = self.root / "bus.token"
        tokenfile.write_token(token)
        self.bed = bed
        coord = bed.nodes["coordinator"] if bed is not None else None
        chost = coord.ns_addr if coord is not None else "127.0.0.1"
        self.port = free_port()
        self.url = f"http://{chost}:{self.port}"
        bus_port = free_port()
        self.bus = f"tcp://{chost}:{bus_port}"
        isolate = isolate or {}
        self.profile_params = {PROFILE: {"n_parallel": n_parallel, "n_ctx": n_ctx, "use_mmap": True},
                               ALT_PROFILE: {"n_parallel": n_parallel, "n_ctx": int(n_ctx * ALT_CTX_FACTOR),
                                             "use_mmap": False}}
        profiles = {"profiles": {p: {"description": f"both engines serve SmolLM2 ({', '.join(f'{k} {v}' for k, v in ps.items())})",
                                     "engines": {n: {"model": MODEL, "params": ps} for n in ENGINES}}
                                 for p, ps in self.profile_params.items()},
                    "default": PROFILE}
        (self.root / "profiles.yaml").write_text(yaml.safe_dump(profiles))
        cfg = {"http": {"host": "127.0.0.1", "port": self.port},
               "bus": f"tcp://0.0.0.0:{bus_port}" if isolate else self.bus,
               "events": f"tcp://127.0.0.1:{free_port()}", "heartbeat_interval_s": HEARTBEAT_S,
               "liveness": LIVENESS, "registry": str(REGISTRY), "profiles": str(self.root / "profiles.yaml"),
               "first_token_timeout_s": 60, "token_timeout_s": 30, "load_timeout_s": 120,
               "state_dir": str(self.root / "coordinator-state"), "bus_token_file": str(token),
               "sessions": {"store": {"dir": str(self.store_dir)}}}
        if coord is not None and bed is not None:
            cfg.update(http={"host": chost, "port": self.port}, events=f"tcp://{chost}:{free_port()}",
                       bus={"endpoint": self.bus, "request_stream": "off"},  # every engine link through its relay
                       admin_allow_from=["127.0.0.0/8", bed.subnet])
        (self.root / "coordinator.yaml").write_text(yaml.safe_dump(cfg))
        py = sys.executable
        cargv = [py, "-m", "hydrad.coordinator.daemon", "--config", str(self.root / "coordinator.yaml")]
        self.coordinator = Daemon("coordinator", coord.wrap(cargv) if coord is not None else cargv,
                                  self.root / "coordinator.log", self.root)
        self.engines: dict[str, Daemon] = {}
        self.engine_http: dict[str, str] = {}
        self.engine_rpc: dict[str, int] = {}
        for name in ENGINES:
            http_port, rpc_port = free_port(), free_port()
            link: NetLink | Node | None = isolate.get(name) or (bed.nodes[name] if bed is not None else None)
            host = link.ns_addr if link is not None else "127.0.0.1"
            ecfg = {"name": name, "http": {"host": host, "port": http_port}, "rpc": {"host": host, "port": rpc_port},
                    "models_dir": str(models_dir()), "registry": str(REGISTRY), "drain_timeout_s": 10,
                    "defaults": {"n_ctx": n_ctx, "n_parallel": n_parallel, "n_threads": 1},
                    "bus": {"endpoint": self._bus_for(link, bus_port),
                            "token_file": str(token), "heartbeat_interval_s": HEARTBEAT_S}}
            if link is not None:
                ecfg["control_allow_from"] = ["127.0.0.0/8", "::1/128", link.subnet]
            (self.root / f"{name}.yaml").write_text(yaml.safe_dump(ecfg))
            argv = [py, "-m", "hydrad.cli.hydrad", "--config", str(self.root / f"{name}.yaml")]
            self.engines[name] = Daemon(name, link.wrap(argv) if link is not None else argv,
                                        self.root / f"{name}.log", self.root)
            self.engine_http[name] = f"http://{host}:{http_port}"
            self.engine_rpc[name] = rpc_port
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _bus_for(self, link: NetLink | Node | None, bus_port: int) -> str:
        """The bus endpoint an engine behind ``link`` connects to."""
        if isinstance(link, Node):
            host, port = link.reach((self.bus.split("//")[1].rsplit(":", 1)[0], bus_port), free_port())
            return f"tcp://{host}:{port}"
        return f"tcp://{link.host_addr}:{bus_port}" if link is not None else self.bus

    # ----- life cycle --------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> float:
        """Start everything; seconds until both engines serve the profile."""
        t0 = time.monotonic()
        self.coordinator.start()
        self.wait_coordinator(60)
        for d in self.engines.values():
            d.start()
        self.wait_pool(timeout)
        return time.monotonic() - t0

    def close(self) -> None:
        for d in [*self.engines.values(), self.coordinator]:
            d.stop(timeout=10)
        self.http.close()

    def pids(self) -> dict[str, int]:
        return {d.name: d.pid for d in [self.coordinator, *self.engines.values()] if d.alive()}

    # ----- what the coordinator says -----------------------------------------------------------

    def engines_view(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.http.get("/admin/engines", timeout=5).json()["engines"]}

    def wait_coordinator(self, timeout: float = 60.0) -> float:
        def up() -> bool:
            if not self.coordinator.alive():
                raise RuntimeError(f"the coordinator exited:\n{self.coordinator.log_tail()}")
            return self.http.get("/admin/engines", timeout=2).status_code == 200
        return wait_for("the coordinator's admin API", up, timeout)[1]

    def serving(self, names: tuple[str, ...] = ENGINES) -> bool:
        es = self.engines_view()
        return all(n in es and es[n]["alive"] and es[n]["stage"] == "ready" and es[n]["model"] == MODEL for n in names)

    def instances(self) -> dict[str, str]:
        """Each engine's instance id as the coordinator knows it (a restarted engine has a new one)."""
        return {n: str(e.get("instance")) for n, e in self.engines_view().items()}

    def wait_pool(self, timeout: float = 120.0, names: tuple[str, ...] = ENGINES,
                  not_instances: dict[str, str] | None = None) -> float:
        """Seconds until every named engine is alive, ready and serving the profile's model; with
        ``not_instances``, as an instance other than those (the restarted process, not the dead one's
        record)."""
        def ok() -> bool:
            for n in names:
                if not self.engines[n].alive():
                    raise RuntimeError(f"engine {n} exited:\n{self.engines[n].log_tail()}")
            if not_instances and any(self.instances().get(n) == i for n, i in not_instances.items()):
                return False
            return self.serving(names)
        return wait_for(f"engines {', '.join(names)} serving {MODEL}", ok, timeout)[1]

    def wait_dead(self, name: str, timeout: float = 15.0) -> float:
        return wait_for(f"{name} marked dead", lambda: not self.engines_view()[name]["alive"], timeout, 0.02)[1]

    def wait_alive(self, name: str, timeout: float = 30.0) -> float:
        return wait_for(f"{name} alive again", lambda: self.engines_view().get(name, {}).get("alive"), timeout, 0.02)[1]

    def active_profile(self) -> str | None:
        """The profile the coordinator reports as active (a switch makes its target active as it begins)."""
        return self.http.get("/admin/engines", timeout=5).json().get("profile")

    def serves_profile(self, name: str, profile: str) -> bool:
        """Whether engine ``name`` is alive, ready and runs ``profile``'s parameters: its ``n_ctx`` as the
        coordinator hears it, and ``n_ctx`` and ``use_mmap`` as the engine's own effective config says."""
        e = self.engines_view().get(name)
        want = self.profile_params[profile]
        if not (e and e["alive"] and e["stage"] == "ready" and e["model"] == MODEL and e["n_ctx"] == want["n_ctx"]):
            return False
        params = httpx.get(self.engine_http[name] + "/control/config", timeout=5).json()["params"]
        return all(params[k]["value"] == v for k, v in want.items())

    def inflight(self) -> int:
        return sum(int(e.get("inflight") or 0) for e in self.engines_view().values())

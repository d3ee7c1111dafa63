"""Start a real hydrad subprocess for a test: free port, own config, own NOTIFY_SOCKET.

systemd is not PID 1 here, so the test plays its part: it binds the notify datagram socket
the daemon writes to and reads what a service manager would receive.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import httpx
import yaml

from tests.support.wait import eventually

REPO = Path(__file__).resolve().parents[2]
REGISTRY = REPO / "etc" / "hydra" / "models.yaml"
SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"


def models_dir() -> Path:
    return Path(os.environ.get("HYDRA_MODELS_DIR", REPO / "models"))


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def port_range() -> tuple[int, int]:
    """[low, high): the loopback ports this test process hands out, below the kernel's ephemeral
    range. Under pytest-xdist each worker has a slice of its own: a worker remembers only the
    ports it handed out, so two of them drawing from one range could hand out the same port in
    the moment before its daemon binds it."""
    high, _ = _ephemeral_range()
    low = 10000 if high > 12000 else 1024
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if count > 1 and worker[2:].isdigit():
        width = (high - low) // count
        low += int(worker[2:]) * width
        high = low + width
    return low, high


def free_port() -> int:
    """A free loopback port of :func:`port_range`. A port the kernel picks for ``bind(0)`` comes
    from the same range as the local ports of outgoing connections, so between this call and the
    daemon's own bind a client socket of another test could take it (seen as "address already in
    use"); below that range only listeners compete, and none of ours repeats a port it handed out."""
    low, high = port_range()
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # the low range is crowded: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_offset(ports: Sequence[int]) -> int:
    """An offset (``hydractl up --port-offset``) that moves every one of ``ports`` into
    :func:`port_range`, each of them free now and none handed out before; from then on they count
    as handed out (:func:`free_port` passes them over)."""
    low, high = port_range()
    for _ in range(200):
        offset = random.randrange(low - min(ports), high - max(ports))
        moved = {p + offset for p in ports}
        if not moved & _handed_out and all(_bindable(p) for p in moved):
            _handed_out.update(moved)
            return offset
    raise AssertionError(f"no offset in {low}..{high} leaves all of {sorted(ports)} free")


class NotifyListener:
    """A bound AF_UNIX datagram socket collecting sd_notify messages with arrival times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode("utf-8")))

    def lines(self) -> list[str]:
        return [line for _, m in self.messages for line in m.splitlines()]

    def wait_for(self, text: str, timeout: float = 10.0) -> float:
        """When ``text`` first arrived as a line of a notify message."""
        t = eventually(lambda: next((t for t, m in list(self.messages) if text in m.splitlines()), None),
                       timeout, f"{text!r} on NOTIFY_SOCKET", interval=0.01, context=lambda: f"got {self.lines()}")
        return t

    def wait_prefix(self, prefix: str, timeout: float = 10.0) -> str:
        return eventually(lambda: next((line for line in self.lines() if line.startswith(prefix)), None),
                          timeout, f"a line starting {prefix!r} on NOTIFY_SOCKET", interval=0.01,
                          context=lambda: f"got {self.lines()}")

    def count(self, line: str) -> int:
        return self.lines().count(line)

    def wait_count(self, line: str, above: int, timeout: float = 30.0) -> int:
        """Until more than ``above`` notify lines equal ``line`` (e.g. another READY=1)."""
        return eventually(lambda: self.count(line), timeout, f"more than {above} {line!r} on NOTIFY_SOCKET",
                          until=lambda n: n > above, context=lambda: f"got {self.lines()}")

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def metric(e: "Engine", name: str) -> float:
    """The value of an unlabelled sample ``name`` on the engine's ``/metrics``."""
    for line in e.http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def steps_of_bursts(e: "Engine", url: str, path: str, bodies: Sequence[bytes], tries: int = 5) -> list[float]:
    """How many ``llama_decode`` calls engine ``e`` made for each of ``tries`` bursts of POSTs to ``url``:
    each body goes on its own connection but its last byte, then the last bytes back to back, so the
    requests complete together, as a burst arrives. Every answer must be a 200."""
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    raw = [(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\nConnection: close\r\n\r\n").encode() + b for b in bodies]
    steps = []
    for _ in range(tries):
        conns = [socket.create_connection((host, port), timeout=60) for _ in raw]
        before = metric(e, "llamacpp:n_decode_total")
        for c, r in zip(conns, raw):  # all but the last byte: no request is complete yet
            c.sendall(r[:-1])
        time.sleep(0.05)
        for c, r in zip(conns, raw):  # then the last bytes back to back: they complete together
            c.sendall(r[-1:])
        for c in conns:
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
            c.close()
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        steps.append(metric(e, "llamacpp:n_decode_total") - before)
    return steps


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, as systemd stops a service; SIGKILL if it is still there after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def sibling_quant(src: Path, out: Path, ftype: int = 7) -> Path:
    """Requantize ``src`` with llama.cpp's own quantizer (``ftype`` 7 = LLAMA_FTYPE_MOSTLY_Q8_0): a sibling
    quant of the same model, as a user would make with llama-quantize."""
    import ctypes

    from hydrad.engine import llama

    C = llama.lib()
    qp = C.llama_model_quantize_default_params()
    qp.ftype = ftype
    qp.allow_requantize = True
    qp.nthread = 2
    rc = C.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(qp))
    if rc != 0 or not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {out}, ftype {ftype}) failed with {rc}")
    return out


def address_space_limit(nbytes: int) -> list[str]:
    """A command prefix that runs a process with at most ``nbytes`` of address space (RLIMIT_AS): an
    allocation past it fails inside that process instead of pushing the machine into swap or the
    OOM killer. The limit is inherited by the process's children."""
    return ["prlimit", f"--as={int(nbytes)}", "--"]


class Engine:
    def __init__(self, tmp: Path, defaults: dict[str, Any] | None = None, name: str = "test",
                 extra: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 wrap: Sequence[str] = (), flags: Sequence[str] | None = None, port: int | None = None) -> None:
        """``wrap`` is a command prefix the daemon runs under, e.g. ``address_space_limit(8 << 30)``
        (``prlimit --as=... --``) so that a test feeding it hostile input cannot exhaust the machine.
        ``flags``: the daemon's command line instead of ``--config`` with a YAML made here (llama-server's
        flags, and a ``--config`` of the test's own if it wants one); ``port``: the HTTP port they make
        it listen on (default: a free one, which they must then name)."""
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / f"{name}.yaml"
        cfg: dict[str, Any] = {
            "name": name, "http": {"host": "127.0.0.1", "port": self.port}, "rpc": {"port": free_port()},
            "models_dir": str(models_dir()), "registry": str(REGISTRY), "drain_timeout_s": 10,
            "defaults": {"n_ctx": 4096, "n_parallel": 4, **(defaults or {})},
        }
        for key, value in (extra or {}).items():  # a section (http, rpc, ...) is merged, not replaced
            cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        if flags is None:
            self.config.write_text(yaml.safe_dump(cfg))
        self.notify = NotifyListener(tmp / f"notify-{name}.sock")
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "wb")
        env = dict(env or {})
        if env.get("JOURNAL_STREAM") == "auto":  # what systemd sets when stdout/stderr is the journal
            st = os.fstat(self._log.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        e = dict(os.environ, NOTIFY_SOCKET=str(self.notify.path), PYTHONUNBUFFERED="1", **env)
        self.started = time.monotonic()
        argv = list(flags) if flags is not None else ["--config", str(self.config)]
        self.proc = subprocess.Popen([*wrap, sys.executable, "-m", "hydrad.cli.hydrad", *argv],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=e, cwd=str(tmp))
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until /health is 200 (a model is loaded and serving)."""
        def health() -> tuple[int, Any]:
            self.assert_running()
            r = self.http.get("/health")
            return r.status_code, r.json()

        _, body = eventually(health, timeout, "the engine to be ready (/health 200)", until=lambda h: h[0] == 200,
                             interval=0.05, ignore=(httpx.TransportError,), context=self.log)
        return body

    def assert_running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"hydrad exited with {self.proc.returncode}:\n{self.log()}")

    def configure(self, wait: bool = True, **payload: Any) -> httpx.Response:
        return self.http.post("/control/configure" + ("?wait=1" if wait else ""), json=payload)

    def stop(self, timeout: float = 30.0) -> int:
        terminate(self.proc, timeout)
        self.http.close()
        self.notify.close()
        self._log.close()
        return self.proc.returncode

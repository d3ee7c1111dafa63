"""``hydractl up`` as a developer runs it, and the coordinator commands against that pool.

Real processes throughout: ``hydractl up`` starts a real ``hydra-coordinator`` and two real
``hydrad`` engines (etc/hydra/dev), the models are loaded by the coordinator's profile, requests
go through the coordinator with the ``openai`` client, and the other hydractl commands run as
subprocesses. Every port of the dev configs is moved by a random ``--port-offset`` so this can
run beside other tests (and beside a developer's own ``scripts/run``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import yaml

from tests.support.engine import GEMMA, REPO, SMOLLM, models_dir, port_offset
from tests.support.wait import eventually

DEV = {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}
SWAPPED = {"dev-a": "gemma3-270m", "dev-b": "smollm2-135m"}
READY = re.compile(r"Hydra pool ready in \S+: profile (\S+), endpoint (http://\S+)/v1")
STARTED = re.compile(r"started (\S+): pid (\d+)")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("HYDRA_COORDINATOR_URL", "HYDRA_ENGINE_URL")}


def hydractl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO), env=_env(), stdin=subprocess.DEVNULL)


# The ports of etc/hydra/dev's configs, and the request stream's beside the bus (9502).
DEV_PORTS = (8080, 8081, 8082, 9000, 9500, 9501, 9502, 9503, 9504, 9505)


def _offset() -> int:
    # The dev ports moved where free_port() draws from (below the kernel's ephemeral range, and
    # this worker's own), none of them taken: a pool of an earlier test may still be running.
    return port_offset(DEV_PORTS)


def _ours(logs: Path) -> list[int]:
    """PIDs of processes whose command line names a file under ``logs`` (the config copies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(logs) in cmdline:
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"  # a zombie is dead, only not yet reaped


class Up:
    """A running ``hydractl up`` subprocess and what it printed."""

    def __init__(self, logs: Path, *args: str) -> None:
        self.logs = logs
        self.args = args
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "hydrad.cli.hydractl", "up", "--logs", str(logs), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                                     env=_env(), stdin=subprocess.DEVNULL)
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.errors), daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr ---\n" + "\n".join(self.errors)

    def logs_tail(self) -> str:
        out = []
        for f in sorted(self.logs.glob("*.log")):
            out.append(f"--- {f.name} ---\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    def wait_ready(self, timeout: float = 240.0) -> str | None:
        """The endpoint once printed; None when hydractl up exited first."""
        def endpoint() -> tuple[str | None] | None:
            for line in list(self.lines):
                if m := READY.search(line):
                    return (m.group(2),)
            return (None,) if self.proc.poll() is not None else None

        (url,) = eventually(endpoint, timeout, "hydractl up to print its endpoint", interval=0.1,
                            context=lambda: f"{self.output()}\n{self.logs_tail()}")
        if url is None:  # hydractl up exited first
            for t in self._threads:
                t.join(5)
        return url

    def pids(self) -> dict[str, int]:
        return {m.group(1): int(m.group(2)) for line in list(self.lines) if (m := STARTED.search(line))}

    def wait_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        def line() -> re.Match[str] | None:
            exited = self.proc.poll() is not None  # read before the lines, so none is missed
            for text in list(self.lines):
                if m := re.search(pattern, text):
                    return m
            if exited:
                raise AssertionError(f"hydractl up exited with no line matching {pattern!r}:\n{self.output()}")
            return None

        return eventually(line, timeout, f"a line matching {pattern!r}", interval=0.05, context=self.output)

    def kill(self) -> None:
        """Last resort at teardown: hydractl up and anything still running our configs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in _ours(self.logs):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _need_models() -> None:
    for f in (SMOLLM, GEMMA):
        if not (models_dir() / f).is_file():
            pytest.skip(f"model file {models_dir() / f} is missing (scripts/setup fetches it)")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, str]]:
    """One pool for the whole module (start-up loads two models on a small machine)."""
    _need_models()
    up: Up | None = None
    url = None
    for _ in range(3):  # a port taken by someone else: another offset
        up = Up(tmp_path_factory.mktemp("up-logs"), "--port-offset", str(_offset()), "--timeout", "200")
        url = up.wait_ready()
        if url is not None or "already in use" not in up.output():
            break
    assert up is not None
    try:
        assert url is not None, f"hydractl up exited with {up.proc.returncode}:\n{up.output()}\n{up.logs_tail()}"
        yield up, url
    finally:
        up.kill()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def engines(url: str) -> dict[str, dict]:
    return {e["name"]: e for e in httpx.get(url + "/admin/engines", timeout=30).json()["engines"]}


# ----- without a pool: refusals before anything starts --------------------------------------

def test_up_names_a_taken_port() -> None:
    offset = _offset()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 9000 + offset))  # the coordinator's HTTP port, moved
        s.listen()
        r = hydractl("up", "--port-offset", str(offset), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"port {9000 + offset} is already in use" in r.stderr
    assert "coordinator HTTP" in r.stderr and "http.port" in r.stderr
    assert "started" not in r.stdout  # nothing was started


def test_up_refuses_an_unknown_profile() -> None:
    r = hydractl("up", "--profile", "nope", "--port-offset", str(_offset()), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "nope" in r.stderr and "dev" in r.stderr and "swapped" in r.stderr


def test_up_moves_every_port_in_copies_of_the_configs(tmp_path: Path) -> None:
    import yaml

    from hydrad.cli.up import plan
    from hydrad.coordinator.settings import load_config as load_coordinator
    from hydrad.engine.settings import load_config as load_engine

    p = plan(REPO / "etc" / "hydra" / "dev", "swapped", 1000, tmp_path, tmp_path / "state")
    assert p.copies and p.profile == "swapped" and p.http_url == "http://127.0.0.1:10000"
    assert p.targets == SWAPPED and p.engine_urls == {"dev-a": "http://127.0.0.1:9081", "dev-b": "http://127.0.0.1:9082"}
    assert sorted(x.port for x in p.ports) == [9081, 9082, 10000, 10500, 10501, 10504, 10505]
    cs = load_coordinator(p.coordinator_config).settings
    assert (cs.http.port, cs.bus.endpoint, cs.events, cs.default_profile) == \
        (10000, "tcp://127.0.0.1:10500", "tcp://127.0.0.1:10501", "swapped")
    assert cs.registry == REPO / "etc" / "hydra" / "models.yaml"
    if "state_dir" in type(cs).model_fields:  # a pool starts on its profile, not on what another one saved
        assert cs.state_dir == tmp_path / "state"
    for name, path in p.engine_configs.items():
        assert path.parent == tmp_path
        es = load_engine(path).settings
        assert es.name == name and es.bus.endpoint == cs.bus.endpoint
        assert es.models_dir == (REPO / "models").resolve() and es.defaults == {"n_threads": 1, "n_parallel": 4,
                                                                               "n_ctx": 8192}
        assert "model" not in yaml.safe_load(path.read_text())["defaults"]
    # no offset, the file's own profile: the files as they are
    same = plan(REPO / "etc" / "hydra" / "dev", None, 0, tmp_path / "unused")
    assert not same.copies and same.engine_configs["dev-a"] == REPO / "etc" / "hydra" / "dev" / "dev-a.yaml"
    assert same.http_url == "http://127.0.0.1:9000" and same.targets == DEV


@pytest.mark.model
def test_up_stops_the_rest_when_a_child_dies_during_start_up(tmp_path: Path) -> None:
    _need_models()
    up = Up(tmp_path, "--port-offset", str(_offset()))
    try:
        m = up.wait_line(r"started dev-b: pid (\d+)")
        log = tmp_path / "dev-b.log"
        eventually(lambda: "listening" in (log.read_text() if log.exists() else ""), 60, "dev-b to log listening",
                   interval=0.05)
        os.kill(int(m.group(1)), signal.SIGKILL)
        assert up.proc.wait(120) == 1, up.output()
        for t in up._threads:
            t.join(5)
        assert "dev-b was killed by SIGKILL during start-up" in up.output()
        assert "its last lines" in up.output() and "msg=listening engine=dev-b" in up.output()
        pids = up.pids()
        assert set(pids) == {"coordinator", "dev-a", "dev-b"}
        assert all(_gone(pid) for pid in pids.values()), up.output()
        assert _ours(tmp_path) == []
    finally:
        up.kill()


# ----- one pool ------------------------------------------------------------------------------

@pytest.mark.model
def test_up_serves_the_profile_through_the_coordinator(pool: tuple[Up, str]) -> None:
    up, url = pool
    assert READY.search("\n".join(up.lines)).group(1) == "dev"  # type: ignore[union-attr]
    assert f"curl -i {url}/v1/chat/completions" in "\n".join(up.lines)
    assert {p.name for p in up.logs.glob("*.log")} == {"coordinator.log", "dev-a.log", "dev-b.log"}
    c = client(url)
    for model, engine in (("smollm2-135m", "dev-a"), ("gemma3-270m", "dev-b")):
        raw = c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
        assert raw.headers["x-hydra-engine"] == engine
        resp = raw.parse()
        assert resp.model == model and resp.choices[0].message.content
        assert resp.usage is not None and resp.usage.completion_tokens > 0
    stream = c.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Count to five."}],
                                       max_tokens=8, temperature=0, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text


@pytest.mark.model
def test_up_prints_the_console_command_of_this_pool(pool: tuple[Up, str]) -> None:
    """The pool runs with a --port-offset: the printed hydra-console command names the moved admin URL
    and event endpoint, as the console parses them, and both are this pool's."""
    from tui.app import build_parser

    up, url = pool
    (line,) = [ln for ln in up.lines if "hydra-console" in ln or "-m tui.app" in ln]
    words = shlex.split(line)
    args = build_parser().parse_args(words[words.index("--admin"):])
    assert args.admin == url
    coordinator = yaml.safe_load((up.logs / "configs" / "coordinator.yaml").read_text())
    assert args.coordinator == coordinator["events"]
    assert set(engines(args.admin)) == set(DEV)


@pytest.mark.model
def test_the_pool_bus_admits_only_its_own_engines(pool: tuple[Up, str]) -> None:
    """hydractl up gives each pool a random bus token: its engines joined with it, and any other
    local process that connects to the bus is refused (no prompts, no configure for it)."""
    import zmq

    from hydrad.wire import messages as M

    up, _ = pool
    offset = int(up.args[up.args.index("--port-offset") + 1])
    assert "bus_token=true" in (up.logs / "coordinator.log").read_text()
    for name in DEV:
        assert "token=true" in (up.logs / f"{name}.log").read_text()
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.IDENTITY, b"intruder~1")
        d.connect(f"tcp://127.0.0.1:{9500 + offset}")
        d.send_multipart(M.encode(M.Register(engine="intruder", instance="x.1", version="0")))
        assert d.poll(10_000), "no answer to an unauthenticated REGISTER"
        refused = M.decode(d.recv_multipart())
        assert isinstance(refused, M.Refused) and "token" in refused.reason
        assert not d.poll(1500)
    finally:
        ctx.destroy(0)
    assert set(engines(pool[1])) == set(DEV)


CONSOLE = re.compile(r"HYDRA_EVENTS_TOKEN_FILE=(\S+) (?:\S*hydra-console|\S+ -m tui\.app) ")


@pytest.mark.model
def test_the_pool_events_need_its_token(pool: tuple[Up, str]) -> None:
    """hydractl up gives each pool an events token and prints the console's command line with it: a
    subscriber presenting it sees the pool's routing, one without it sees nothing."""
    import zmq

    from hydrad.common import tokenfile
    from hydrad.wire import eventsauth

    up, url = pool
    line = next((x for x in up.lines if CONSOLE.search(x)), None)  # the console's command, flags in any order
    assert line is not None, up.output()
    token_file = Path(CONSOLE.search(line).group(1))  # type: ignore[union-attr]
    endpoint = re.search(r"--coordinator (tcp://\S+)", line).group(1)  # type: ignore[union-attr]
    admin = re.search(r"--admin (\S+)", line).group(1)  # type: ignore[union-attr]
    assert admin == url and token_file.stat().st_mode & 0o777 == 0o600
    ctx = zmq.Context()
    try:
        subs = {}
        for name, token in (("with", tokenfile.read_token(token_file)), ("without", None)):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"route")
            eventsauth.present(sub, token)
            sub.connect(endpoint)
            subs[name] = sub
        time.sleep(0.5)  # the subscriptions reach the coordinator
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert subs["with"].poll(10_000), "no route event for the subscriber with the token"
        assert json.loads(subs["with"].recv_multipart()[1])["data"]["req"] == r.json()["id"]
        assert not subs["without"].poll(1000)
    finally:
        ctx.destroy(0)


@pytest.mark.model
def test_engines_shows_both_alive(pool: tuple[Up, str]) -> None:
    _, url = pool
    r = hydractl("engines", url)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[2:] if line.strip()}
    assert r.stdout.splitlines()[1].split()[:6] == ["engine", "alive", "device", "stage", "model", "mode"]
    for name, model in DEV.items():
        assert rows[name][1:6] == ["yes", "all", "ready", model, "SOLO"], r.stdout  # dev engines are bound to no GPU
        assert rows[name][6].endswith("/4")  # slots busy/total
    assert "2/2 engines alive" in r.stdout
    data = json.loads(hydractl("engines", url, "--json").stdout)
    assert {e["name"]: e["alive"] for e in data["engines"]} == {"dev-a": True, "dev-b": True}
    env_run = subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", "engines"], capture_output=True, text=True,
                             timeout=60, cwd=str(REPO), env={**_env(), "HYDRA_COORDINATOR_URL": url})
    assert env_run.returncode == 0 and "dev-a" in env_run.stdout, env_run.stderr


@pytest.mark.model
def test_route_explain_names_an_engine_and_a_reason(pool: tuple[Up, str]) -> None:
    _, url = pool
    r = hydractl("route", "--explain", url, "--model", "smollm2-135m", "--session", "s-explain", "Hello", "there")
    assert r.returncode == 0, r.stderr
    fields = {line.split()[0]: line.split(None, 1)[1] for line in r.stdout.splitlines()
              if line and not line.startswith(" ") and len(line.split(None, 1)) == 2}
    assert fields["engine"] == "dev-a"
    assert fields["step"] == "cost"
    assert fields["reason"].startswith("cheapest for smollm2-135m: dev-a")
    assert "session s-explain" in fields["request"]
    assert re.search(r"^\s+dev-a\s+\d+\.\d{4}", r.stdout, re.M), r.stdout  # its scored candidate line
    assert re.search(r"^\s+dev-b\s+filter: ", r.stdout, re.M), r.stdout  # rejected, with why
    plain = hydractl("route", url, "--model", "gemma3-270m", "Hi")
    assert (plain.returncode, plain.stdout.strip()) == (0, "dev-b")


@pytest.mark.model
def test_admin_route_explains_without_generating(pool: tuple[Up, str]) -> None:
    _, url = pool
    before = {n: e["inflight"] for n, e in engines(url).items()}
    r = httpx.post(url + "/admin/route", json={"model": "gemma3-270m", "prompt": "x" * 4000, "max_tokens": 16,
                                               "session_id": "s-admin"}, timeout=30)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["engine"] == "dev-b" and d["model"] == "gemma3-270m" and d["step"] == "cost"
    assert d["request"] == {"kind": "completion", "model": "gemma3-270m", "prompt_tokens": 1001, "max_tokens": 16,
                            "session_id": "s-admin", "prefix_hash": None, "n_ctx": 8192, "stored_tokens": 0}
    assert [c["engine"] for c in d["candidates"]] == ["dev-b"]
    assert set(d["candidates"][0]) == {"engine", "cost_s", "wait_s", "load_s", "prefill_s", "warm"}
    assert d["rejected"]["dev-a"].startswith("filter: ")
    assert d["loading"] == []
    # the header names the session too
    h = httpx.post(url + "/admin/route", json={"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"X-Session-Id": "s-header"}, timeout=30).json()
    assert h["request"]["session_id"] == "s-header" and h["request"]["kind"] == "chat"
    assert h["engine"] == "dev-a" and h["model"] == DEV[h["engine"]]
    # no model in a pool serving two, and no default_model: refused as on /v1/*, naming both
    none = httpx.post(url + "/admin/route", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert none.status_code == 400 and "gemma3-270m" in none.text and "smollm2-135m" in none.text
    # refusals as on /v1/*
    assert httpx.post(url + "/admin/route", json={"model": "nope", "prompt": "hi"}, timeout=30).status_code == 404
    bad = httpx.post(url + "/admin/route", json={"model": "smollm2-135m"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["message"]
    assert httpx.post(url + "/admin/route", content=b"{not json", timeout=30).status_code == 400
    assert httpx.post(url + "/admin/route", json=[1, 2], timeout=30).status_code == 400
    after = {n: e["inflight"] for n, e in engines(url).items()}
    assert before == after == {"dev-a": 0, "dev-b": 0}
    r = hydractl("route", url, "--model", "nope", "hi")
    assert r.returncode == 2 and "not known to this pool" in r.stderr


@pytest.mark.model
def test_profile_switch_follows_until_done(pool: tuple[Up, str]) -> None:
    _, url = pool
    shown = hydractl("profile", url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "profile dev (steady)"
    r = hydractl("profile", url, "swapped", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "switching to swapped (from dev)"
    assert re.search(r"^switched to swapped in \d+\.\d\ds$", r.stdout, re.M), r.stdout
    for name, model in SWAPPED.items():
        assert re.search(rf"^  {name}: {model}, loaded in \d+\.\d\ds", r.stdout, re.M), r.stdout
    es = engines(url)
    assert {n: (e["model"], e["stage"], e["alive"]) for n, e in es.items()} == \
        {n: (m, "ready", True) for n, m in SWAPPED.items()}
    shown = hydractl("profile", url)
    assert shown.stdout.splitlines()[0] == "profile swapped (steady)"
    assert "last switch: dev -> swapped: ok in" in shown.stdout
    # routing and the front door follow the new placement
    assert hydractl("route", url, "--model", "smollm2-135m", "hi").stdout.strip() == "dev-b"
    raw = client(url).chat.completions.with_raw_response.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert raw.headers["x-hydra-engine"] == "dev-b"
    # the same profile again changes nothing; an unknown one is refused
    again = hydractl("profile", url, "swapped")
    assert again.returncode == 0 and "dev-a: unchanged" in again.stdout
    unknown = hydractl("profile", url, "nope")
    assert unknown.returncode == 2 and "unknown profile 'nope'" in unknown.stderr


@pytest.mark.model
def test_sigint_stops_every_process(pool: tuple[Up, str]) -> None:
    up, _ = pool
    pids = up.pids()
    assert set(pids) == {"coordinator", "dev-a", "dev-b"}
    assert not any(_gone(p) for p in pids.values())
    t0 = time.monotonic()
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.output()
    for t in up._threads:
        t.join(5)
    assert time.monotonic() - t0 < 30
    assert all(_gone(p) for p in pids.values()), up.output()
    assert _ours(up.logs) == []
    assert re.search(r"stopped \(coordinator 0, dev-a 0, dev-b 0\)", up.output()), up.output()
    for name in pids:
        assert "msg=stopped" in (up.logs / f"{name}.log").read_text(), up.logs_tail()

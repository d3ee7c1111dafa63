"""A real systemd (PID 1 of its own namespaces, scripts/systemd-sandbox) with Hydra installed
into it by the README's "Install on a host" block itself, read from README.md and run step by
step, then driven only through systemctl, journalctl, hydractl and HTTP (curl inside the sandbox:
its network namespace is its own).

Needs root, util-linux, overlayfs, systemd, the default models and the llama-cpp-python wheel
that scripts/setup built; the install step runs pip with this host's network (as scripts/setup
does). Set HYDRA_SYSTEM_KEEP=1 to leave the sandbox running after the tests (its PID is printed;
`scripts/systemd-sandbox shell PID`, then `scripts/systemd-sandbox stop PID`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "scripts" / "systemd-sandbox"
MODELS = Path(os.environ.get("HYDRA_MODELS_DIR", ROOT / "models"))
MODEL_FILES = ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf")
CACHE = Path(os.environ.get("HYDRA_CACHE_DIR", Path.home() / ".cache" / "hydra"))
ADMIN_ENV = "HYDRA_ADMIN_TOKEN_FILE=/etc/hydra/admin.token"
COORDINATOR = "http://127.0.0.1:9000"
# The two engines of the tests: CPU copies of the shipped GPU examples.
ENGINES = {
    "a": {"from": "5060ti.yaml", "model": "gemma3-270m", "http": 8080, "rpc": 9503},
    "b": {"from": "3060.yaml", "model": "smollm2-135m", "http": 8081, "rpc": 9504},
}


def llama_wheel() -> Path | None:
    """The llama-cpp-python wheel scripts/setup built and installed into .venv."""
    key = ROOT / ".venv" / ".hydra-llama-key"
    if not key.is_file():
        return None
    wheels = sorted((CACHE / "wheels" / key.read_text().strip()).glob("llama_cpp_python-*.whl"))
    return wheels[0] if wheels else None


def inside(path: Path) -> str:
    """Where a bound host directory appears inside the sandbox: at its own path, except below
    /tmp or /var/tmp, which the sandbox's systemd-tmpfiles empties (scripts/systemd-sandbox's
    inside_path: below /srv/sandbox-binds)."""
    p = str(path.resolve())
    for tmp in ("/tmp", "/var/tmp"):
        if p == tmp or p.startswith(tmp + "/"):
            return "/srv/sandbox-binds" + p
    return p


def why_not() -> str | None:
    """What this machine lacks for the system tests (None: nothing)."""
    if not SANDBOX.exists():
        return f"{SANDBOX} is missing"
    out = subprocess.run([str(SANDBOX), "missing"], capture_output=True, text=True, check=False)
    if out.stdout.strip():
        return f"cannot boot a systemd sandbox: {out.stdout.strip()}"
    for name in MODEL_FILES:
        if not (MODELS / name).is_file():
            return f"model {MODELS / name} is missing (scripts/setup fetches it)"
    if llama_wheel() is None:
        return "no cached llama-cpp-python wheel (scripts/setup builds it)"
    return None


class Sandbox:
    def __init__(self, pid: str, log: Path) -> None:
        self.pid = pid
        self.log = log
        self.broken: str | None = None

    # --- running things inside ------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 60, input: str | None = None,
            host_net: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [str(SANDBOX), "exec", *(["--host-net"] if host_net else []), self.pid, *cmd]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input, check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"{shlex.join(cmd)} exited {out.returncode}\n{out.stdout}{out.stderr}")
        return out

    def sh(self, script: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run("bash", "-euo", "pipefail", "-c", script, **kw)

    def popen(self, *cmd: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(SANDBOX), "exec", self.pid, *cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)

    def write(self, path: str, text: str, mode: str = "644", owner: str = "root") -> None:
        self.run("install", "-D", "-m", mode, "-o", owner, "-g", owner, "/dev/stdin", path, input=text)

    def read(self, path: str) -> str:
        return self.run("cat", path).stdout

    # --- systemd ----------------------------------------------------------------------------
    def systemctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str) -> list[dict[str, Any]]:
        out = self.run("journalctl", "--no-pager", "-o", "json", *args).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def journal_text(self, unit: str, lines: int = 40) -> str:
        return self.run("journalctl", "--no-pager", "-u", unit, "-n", str(lines), check=False).stdout

    # --- HTTP and hydractl --------------------------------------------------------------------
    def http(self, method: str, url: str, body: Any = None, timeout: float = 60) -> tuple[int, str]:
        """(status, body); status 0 when no HTTP answer came (refused, reset, timed out)."""
        cmd = ["curl", "-sS", "-X", method, "--max-time", str(timeout), "-w", "\n%{http_code}", url]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        out = self.run(*cmd, check=False, timeout=timeout + 30,
                       input=json.dumps(body) if body is not None else None)
        text, _, code = out.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), (text or out.stderr)

    def hydractl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("env", ADMIN_ENV, "hydractl", *args, check=check)

    def engines(self) -> dict[str, dict[str, Any]]:
        out = self.hydractl("engines", "--json", check=False)
        try:
            return {e["name"]: e for e in json.loads(out.stdout)["engines"]}
        except (ValueError, KeyError):
            return {}

    def profile(self) -> dict[str, Any]:
        out = self.hydractl("profile", "--json", check=False)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {}

    def diagnostics(self) -> str:
        parts = [self.systemctl("status", "hydra-coordinator", "hydrad@a", "hydrad@b", check=False).stdout]
        for unit in ("hydra-coordinator", "hydrad@a", "hydrad@b"):
            parts.append(f"--- journal of {unit}\n{self.journal_text(unit, 25)}")
        return "\n".join(parts)

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 90, interval: float = 0.3) -> Any:
        return eventually(check, timeout, what, interval=interval, context=self.diagnostics)

    # --- the pool ---------------------------------------------------------------------------------
    def pool_serving(self) -> bool:
        """Both engines registered, alive and serving their model."""
        engines = self.engines()
        return all(engines.get(n, {}).get("alive") and engines[n].get("stage") == "ready"
                   and engines[n].get("model") == spec["model"] for n, spec in ENGINES.items())

    def profile_applied(self) -> bool:
        """hydractl profile: every engine matches its target."""
        prof = self.profile().get("engines") or {}
        return all(prof.get(n, {}).get("matches") for n in ENGINES)

    def ensure_pool(self, timeout: float = 90) -> None:
        """Start what is not running and wait until both engines serve. Once this has failed, later
        calls fail at once (the suite must not spend minutes per test on a pool that never came up)."""
        if self.broken:
            raise AssertionError(f"the pool is down since an earlier test: {self.broken}")
        self.systemctl("start", "hydra.target", *(f"hydrad@{n}" for n in ENGINES))
        try:
            self.wait_for("both engines registered and serving their models", self.pool_serving, timeout)
        except AssertionError as exc:
            self.broken = str(exc).splitlines()[0]
            raise

    def chat(self, url: str, model: str | None = None, max_tokens: int = 8, timeout: float = 60) -> tuple[int, str]:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hello."}],
                                "max_tokens": max_tokens, "temperature": 0}
        if model:
            body["model"] = model
        return self.http("POST", f"{url}/v1/chat/completions", body, timeout=timeout)


def engine_config(name: str) -> str:
    """/etc/hydra/<name>.yaml: the shipped GPU example with its name and ports, for a CPU."""
    spec = ENGINES[name]
    cfg = yaml.safe_load((ROOT / "etc" / "hydra" / spec["from"]).read_text())
    cfg["name"] = name
    cfg["http"]["port"] = spec["http"]
    cfg["rpc"]["port"] = spec["rpc"]
    cfg["defaults"] = {"model": spec["model"], "n_gpu_layers": 0, "n_ctx": 2048, "n_parallel": 2,
                       "n_threads": 1, "n_threads_batch": 1, "flash_attn": "off"}
    return yaml.safe_dump(cfg, sort_keys=False)


def profiles_config() -> str:
    """/etc/hydra/profiles.yaml: the shipped file with the default profile's engines renamed a, b."""
    prof = yaml.safe_load((ROOT / "etc" / "hydra" / "profiles.yaml").read_text())
    coordinator = yaml.safe_load((ROOT / "etc" / "hydra" / "coordinator.yaml").read_text())
    default = coordinator.get("default_profile") or prof["default"]
    prof["profiles"] = {default: {"description": "CPU pool of the system tests",
                                  "engines": {n: {"model": s["model"], "mode": "SOLO"} for n, s in ENGINES.items()}}}
    prof["default"] = default
    return yaml.safe_dump(prof, sort_keys=False)


def token_files(node: Any) -> Iterator[str]:
    """Every *token_file value of a config."""
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key).endswith("token_file") and isinstance(value, str):
                yield value
            else:
                yield from token_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from token_files(item)


README = ROOT / "README.md"
INSTALL_HEADING = "## Install on a host"


def readme_blocks() -> list[str]:
    """The fenced blocks of the README's "Install on a host" section: the install steps, then the check."""
    text = README.read_text(encoding="utf-8")
    assert INSTALL_HEADING in text, f"README.md has no {INSTALL_HEADING!r} section"
    section = text.split(INSTALL_HEADING, 1)[1].split("\n## ", 1)[0]
    parts = section.split("```")
    return [parts[i].strip("\n") for i in range(1, len(parts), 2)]


def readme_install_steps() -> dict[int, str]:
    """The install block split at its ``# N.`` comments: {N: that step's lines}; 0 is what precedes step 1."""
    steps: dict[int, list[str]] = {0: []}
    current = 0
    for line in readme_blocks()[0].splitlines():
        head = line.split(".", 1)[0]
        if line.startswith("# ") and head[2:].isdigit():
            current = int(head[2:])
            steps[current] = []
        steps[current].append(line)
    return {n: "\n".join(lines).strip() for n, lines in steps.items()}


def exactly(script: str, old: str, new: str) -> str:
    """``script`` with ``old`` replaced; the README must still say ``old`` (else this test is out of step)."""
    assert old in script, f"the README's install step no longer says {old!r}:\n{script}"
    return script.replace(old, new)


def run_step(sb: Sandbox, steps: dict[int, str], n: int, engine: str | None = None, **kw: Any) -> str:
    """Step ``n`` as the README writes it, in the checkout's copy (as root, from the checkout)."""
    script = steps[n]
    prelude = f"cd /usr/src/hydra\nNAME={shlex.quote(engine)}\n" if engine else "cd /usr/src/hydra\n"
    return sb.sh(prelude + script, **kw).stdout


def install(sb: Sandbox) -> None:
    """README's "Install on a host", step by step, for a CPU host with engines a and b. Each step
    runs as written; the only substitutions are where this machine's files are (the checkout's
    copy, the wheel, the models) and step 5's "edit them" (the CPU configs of engines a and b)."""
    wheel = llama_wheel()
    assert wheel is not None
    steps = readme_install_steps()
    assert sorted(steps) == list(range(8)), sorted(steps)
    assert steps[0].split("#")[0].strip() == "NAME=5060ti", steps[0]
    # The checkout, as a clone would have it, at /usr/src/hydra (the README's steps run in a checkout).
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    listing = "\n".join(f for f in files if f and (ROOT / f).is_file())
    sb.write("/root/hydra-files", listing + "\n")
    sb.sh(f"mkdir -p /usr/src/hydra && cd {shlex.quote(inside(ROOT))} && "
          "tar -c --files-from=/root/hydra-files | tar -x -C /usr/src/hydra")
    # 1. The software: the wheel scripts/setup built, from where this machine keeps it.
    step1 = exactly(steps[1], "~/.cache/hydra/wheels/$(cat .venv/.hydra-llama-key)/llama_cpp_python-*.whl",
                    shlex.quote(inside(wheel)))
    step1 = exactly(step1, "/opt/hydra/bin/pip install ", "/opt/hydra/bin/pip install -q ")
    run_step(sb, {1: step1}, 1, host_net=True, timeout=600)
    # 2. The service user (in the GPU device groups this host has) and its directories.
    run_step(sb, steps, 2)
    # 3. The model files, owned by hydra.
    run_step(sb, {3: exactly(steps[3], "models/*.gguf", " ".join(shlex.quote(inside(MODELS / name))
                                                                  for name in MODEL_FILES))}, 3)
    # 4. The secrets.
    run_step(sb, steps, 4)
    # 5. The configs as shipped, then "edit them": CPU engines a and b, the profile that places them.
    for name in ENGINES:
        run_step(sb, steps, 5, name)
    sb.write("/etc/hydra/profiles.yaml", profiles_config())
    for name in ENGINES:
        sb.write(f"/etc/hydra/{name}.yaml", engine_config(name))
    # Every secret the configs name was made by step 4: 0600, owned by hydra.
    tokens = sorted({path for name in ("coordinator", *ENGINES)
                     for path in token_files(yaml.safe_load(sb.read(f"/etc/hydra/{name}.yaml")))})
    assert "/etc/hydra/bus.token" in tokens, tokens
    for path in tokens:
        assert sb.run("stat", "-c", "%a %U %s", path).stdout.split()[:2] == ["600", "hydra"], path
    # 6. The checks pass, without a warning.
    for name in ENGINES:
        out = sb.run("bash", "-euo", "pipefail", "-c", f"cd /usr/src/hydra\nNAME={name}\n" + steps[6], check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "/etc/hydra/coordinator.yaml: ok" in out.stdout and f"/etc/hydra/{name}.yaml: ok" in out.stdout, out.stdout
        assert "warning" not in out.stderr, out.stderr
    # 7. The units, enabled and started.
    for name in ENGINES:
        run_step(sb, steps, 7, name, timeout=180)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("systemd") / "console.log"
    started = time.monotonic()
    wheel = llama_wheel()
    assert wheel is not None
    binds = [arg for d in {MODELS.resolve(), wheel.parent.resolve()} if not d.is_relative_to(ROOT)
             for arg in ("--bind", str(d))]
    # Tied to this process unless kept: a test run killed outright leaves no systemd behind.
    owner = [] if os.environ.get("HYDRA_SYSTEM_KEEP") else ["--owner", str(os.getpid())]
    out = subprocess.run([str(SANDBOX), "start", "--log", str(log), "--timeout", "90", *owner, *binds],
                         capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0, f"the sandbox did not boot:\n{out.stderr}"
    sb = Sandbox(out.stdout.strip().splitlines()[-1], log)
    print(f"\nsystemd sandbox PID {sb.pid} booted in {time.monotonic() - started:.1f}s", file=sys.stderr)
    try:
        t0 = time.monotonic()
        install(sb)
        print(f"installed in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        yield sb
    finally:
        if os.environ.get("HYDRA_SYSTEM_KEEP"):
            print(f"\nsystemd sandbox kept: PID {sb.pid}", file=sys.stderr)
        else:
            subprocess.run([str(SANDBOX), "stop", sb.pid], timeout=120, check=False)

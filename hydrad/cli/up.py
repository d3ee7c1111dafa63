"""``hydractl up``: a whole pool on one machine, without systemd.

Starts ``hydra-coordinator`` on ``<config-dir>/coordinator.yaml`` and one ``hydrad`` per engine
its profiles name, each on ``<config-dir>/<engine>.yaml``, as child processes of this one. It
waits until the coordinator reports every engine alive and the profile applied (models
loaded), prints the OpenAI endpoint and how to use it (a first curl, the exact ``hydra-console``
command for this pool's ports), and runs until SIGINT (Ctrl-C), SIGTERM
or SIGHUP, which stop every child: SIGTERM (each drains as under systemd), then SIGKILL after
``--stop-timeout``; a second Ctrl-C does not wait.

- Each child runs in a process group of its own, so a Ctrl-C at the terminal reaches only this
  process, which then stops the children in order; on Linux a child also gets SIGTERM if this
  process dies without stopping it (``PR_SET_PDEATHSIG``).
- Logs: every line of a child goes to stdout prefixed with its name, or with ``--logs DIR`` to
  ``DIR/<name>.log`` (this process then prints only its own progress).
- ``--port-offset N`` and ``--profile NAME`` need configs that differ from the files: copies
  are written (to ``--logs DIR`` or a temporary directory) with every port moved by N, the
  profile as the coordinator's ``default_profile`` and relative paths made absolute.
- Every pool starts on ``--profile`` or the coordinator's default: the coordinator keeps the
  active profile it would resume after a restart in a temporary directory of this run
  (``$STATE_DIRECTORY``, or ``state_dir`` in a copy when the config names one), never in the
  state of an installed coordinator or of an earlier pool.
- Every pool has a bus token of its own: a random one is written (mode 0600) to this run's
  temporary directory and handed to the coordinator and every engine as
  ``$HYDRA_BUS_TOKEN_FILE``, so no other process on the machine can register on the pool's bus
  as an engine and be sent its users' prompts. It goes away with the pool. So does the pool's events
  token (``$HYDRA_EVENTS_TOKEN_FILE``, which the console presents to read the events): the banner
  shows the console's command line with it.
- When the coordinator's config names an ``admin_token_file``, this process reads it to follow
  the start-up through ``/admin/*``.
- Every port is checked before anything starts; a taken one is named with the file and field
  that asks for it.
- Start-up fails (exit 1, the rest stopped) when a child exits, an engine's model load fails or
  ``--timeout`` passes; the error shows the last lines of the child's log.
- Stdin is never read: it runs the same under a terminal, a pipe or CI.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from hydrad.common import tokenfile
from hydrad.wire.httpapi import AdminHttp, NoAnswer
from hydrad.cli.common import COORDINATOR_URL, COORDINATOR_URL_ENV, EXIT_OK, CliError
from hydrad.cli.up_plan import (
    EXIT_BAD_CONFIG, EXIT_INTERRUPTED, EXIT_START_FAILED, POLL_S, SERVICE_ENV, TAIL_LINES, Plan, console_command,
    hydractl_command, display_path,
    check_ports, default_config_dir, plan,
)

# ----- children --------------------------------------------------------------------------

def _death_signal() -> Any:
    """A preexec function giving the child SIGTERM when we die (Linux), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    return preexec


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None
    proc: subprocess.Popen[bytes] | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    pump: threading.Thread | None = None
    log_file: IO[bytes] | None = None
    reported: bool = False  # its exit was already told

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def last_lines(self) -> list[str]:
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                text = self.log_path.read_text(errors="replace")
                return text.splitlines()[-TAIL_LINES:]
        return list(self.tail)

    def signal_group(self, sig: int) -> None:
        """Signal the child's process group (itself and anything it started), only while it is ours."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


class Output:
    """Whole lines to stdout from several threads, each prefixed with who speaks."""

    def __init__(self, names: list[str], stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.width = max(len(n) for n in names)
        self.lock = threading.Lock()

    def line(self, who: str, text: str) -> None:
        with self.lock:
            try:
                self.stream.write(f"{who:<{self.width}} | {text}\n")
                self.stream.flush()
            except (OSError, ValueError):  # stdout gone (closed pipe): keep running, keep logs in memory
                pass

    def block(self, text: str) -> None:
        with self.lock:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(text + "\n")
                self.stream.flush()


def _pump(child: Child, out: Output) -> None:
    assert child.proc is not None and child.proc.stdout is not None
    for raw in iter(child.proc.stdout.readline, b""):
        text = raw.decode("utf-8", errors="replace").rstrip("\n")
        child.tail.append(text)
        out.line(child.name, text)
    child.proc.stdout.close()


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop_event = threading.Event()
        self.hurry = threading.Event()
        self.signals = 0
        self.children: list[Child] = []
        self.out: Output | None = None
        self.tmp: Path | None = None
        self.state_dir: Path | None = None
        self.bus_token_file: Path | None = None
        self.events_token_file: Path | None = None
        self.admin_token: str | None = None

    # --- signals

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signals += 1
        if self.signals > 1:
            self.hurry.set()  # a second Ctrl-C: do not wait for draining
        self.stop_event.set()

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
        old = {s: signal.signal(s, self._on_signal) for s in sigs}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    # --- main

    def run(self) -> int:
        with self._signals():
            try:
                return self._run()
            except CliError as exc:  # said before the stop, so the reason comes first
                with contextlib.suppress(OSError, ValueError):
                    print(f"hydractl: {exc}", file=sys.stderr, flush=True)
                return exc.code
            finally:
                self.stop()
                if self.tmp is not None:
                    shutil.rmtree(self.tmp, ignore_errors=True)

    def say(self, text: str) -> None:
        if self.out is not None:
            self.out.line("hydractl", text)
        else:
            print(text, flush=True)

    def _run(self) -> int:
        args = self.args
        config_dir = Path(args.config_dir) if args.config_dir else default_config_dir()
        logs = Path(args.logs) if args.logs else None
        self.tmp = Path(tempfile.mkdtemp(prefix="hydra-up-"))
        self.state_dir = self.tmp / "state"  # the coordinator's: nothing carried over from an earlier pool
        if logs is not None:
            try:
                logs.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CliError(f"cannot create the log directory {logs}: {exc.strerror or exc}", EXIT_BAD_CONFIG) from None
            copy_dir = logs / "configs"
            copy_dir.mkdir(exist_ok=True)
        else:
            copy_dir = self.tmp
        p = plan(config_dir, args.profile, args.port_offset, copy_dir, self.state_dir)
        check_ports(p.ports)
        self.bus_token_file = self.tmp / "bus.token"  # mkdtemp made the directory 0700; the file is 0600
        tokenfile.write_token(self.bus_token_file)
        self.events_token_file = self.tmp / "events.token"
        tokenfile.write_token(self.events_token_file)
        if p.admin_token_file is not None:
            try:
                self.admin_token = tokenfile.read_token(p.admin_token_file)
            except tokenfile.TokenError as exc:
                raise CliError(f"{display_path(p.coordinator_config)}: admin_token_file: {exc}", EXIT_BAD_CONFIG) from None

        self.out = Output(["hydractl", "coordinator", *p.engine_configs])
        children = [Child("coordinator", [sys.executable, "-m", "hydrad.coordinator.daemon", "--config",
                                          str(p.coordinator_config)],
                          logs / "coordinator.log" if logs else None)]
        for name, path in p.engine_configs.items():
            children.append(Child(name, [sys.executable, "-m", "hydrad.cli.hydrad", "--config", str(path)],
                                  logs / f"{name}.log" if logs else None))
        self.say(f"configs {display_path(config_dir)}{' (moved copies in ' + display_path(copy_dir) + ')' if p.copies else ''}, "
                 f"profile {p.profile}{', port offset ' + str(args.port_offset) if args.port_offset else ''}")
        if self.stop_event.is_set():
            return EXIT_INTERRUPTED
        t0 = time.monotonic()
        self._spawn(children)
        for c in children:
            where = f", log {display_path(c.log_path)}" if c.log_path else ""
            self.say(f"started {c.name}: pid {c.pid}{where}")
        code = self._wait_ready(p, t0)
        if code is not None:
            return code
        self._banner(p, time.monotonic() - t0, logs)
        return self._serve()

    def _spawn(self, children: list[Child]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        if self.bus_token_file is not None:  # the pool's own bus token, for the coordinator and every engine
            env[tokenfile.ENV_BUS_TOKEN_FILE] = str(self.bus_token_file)
        if self.events_token_file is not None:  # the pool's events token, which the coordinator asks of consoles
            env[tokenfile.ENV_EVENTS_TOKEN_FILE] = str(self.events_token_file)
        preexec = _death_signal()
        # Every child is forked before any thread of ours exists (a preexec function is only safe then).
        for c in children:
            if c.log_path is not None:
                c.log_file = open(c.log_path, "ab")
                stdout: Any = c.log_file
            else:
                stdout = subprocess.PIPE
            child_env = env
            if c.name == "coordinator" and self.state_dir is not None:  # where a coordinator config names no state_dir
                child_env = {**env, "STATE_DIRECTORY": str(self.state_dir)}
            try:
                c.proc = subprocess.Popen(c.argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                                          env=child_env, process_group=0, preexec_fn=preexec)
            except OSError as exc:
                raise CliError(f"cannot start {c.name} ({' '.join(c.argv)}): {exc.strerror or exc}",
                               EXIT_START_FAILED) from None
            self.children.append(c)
        assert self.out is not None
        for c in children:
            if c.log_path is None:
                c.pump = threading.Thread(target=_pump, args=(c, self.out), name=f"log-{c.name}", daemon=True)
                c.pump.start()

    # --- start-up

    def _died(self, c: Child, when: str) -> str:
        assert c.proc is not None
        c.reported = True
        if c.pump is not None:
            c.pump.join(2)  # its last lines
        lines = c.last_lines()
        where = f" (log {display_path(c.log_path)})" if c.log_path else ""
        rc = c.proc.returncode
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        text = f"{c.name} {how}{' ' + when if when else ''}{where}"
        if lines:
            text += "; its last lines:\n" + "\n".join(f"    {ln}" for ln in lines)
        else:
            text += "; it wrote nothing"
        return text

    def _wait_ready(self, p: Plan, t0: float) -> int | None:
        """None once the pool serves the profile; an exit code when start-up failed or was interrupted."""
        deadline = t0 + self.args.timeout
        seen: dict[str, tuple[Any, ...]] = {}
        coordinator_up = False
        last_status = ""
        admin = AdminHttp(p.http_url, timeout=5.0, token=self.admin_token)
        with contextlib.closing(admin):
            while True:
                if self.stop_event.is_set():
                    self.say("interrupted during start-up; stopping")
                    return EXIT_INTERRUPTED
                for c in self.children:
                    if not c.running():
                        raise CliError(self._died(c, "during start-up") + "\nstopping the others", EXIT_START_FAILED)
                if time.monotonic() > deadline:
                    last = last_status or "the coordinator never answered"
                    raise CliError(f"the pool was not ready within {self.args.timeout:g}s ({last}); stopping it",
                                   EXIT_START_FAILED)
                try:
                    engines = {e["name"]: e for e in admin.engines().json()["engines"]}
                    profile = admin.profile().json()
                except (NoAnswer, ValueError, KeyError, TypeError):
                    self.stop_event.wait(POLL_S)
                    continue
                if not coordinator_up:
                    coordinator_up = True
                    self.say(f"coordinator answers at {p.http_url}")
                done, last_status = self._progress(p, engines, profile, seen)
                if done:
                    return None
                self.stop_event.wait(POLL_S)

    def _progress(self, p: Plan, engines: dict[str, Any], profile: dict[str, Any],
                  seen: dict[str, tuple[Any, ...]]) -> tuple[bool, str]:
        """Tell what changed; (whether the pool is ready, one line of where it stands)."""
        targets = profile.get("engines") or {}
        ready = profile.get("active") == p.profile and profile.get("state") == "steady"
        waiting: list[str] = []
        for name, want in p.targets.items():
            e = engines.get(name)
            if e is None:
                key: tuple[Any, ...] = ("absent",)
                text = ""
                waiting.append(f"{name} not registered")
                ok = False
            else:
                frac = e.get("progress")
                key = (e.get("alive"), e.get("stage"), e.get("model"), e.get("loading_model"),
                       int(float(frac) * 10) if frac is not None and e.get("stage") != "ready" else None)
                stage = str(e.get("stage"))
                if frac is not None and stage != "ready":
                    stage += f" {float(frac) * 100:.0f}%"
                loading = e.get("loading_model")
                text = f"{name}: {'alive' if e.get('alive') else 'not alive'}, {stage}"
                text += f", loading {loading}" if loading else ""
                text += f", serving {e.get('model')}" if e.get("model") else ", no model yet"
                t = targets.get(name) or {}
                ok = bool(e.get("alive")) and not e.get("configuring") and (
                    (want is None) or bool(t.get("matches") and e.get("stage") == "ready"))
                if not ok:
                    waiting.append(f"{name} {stage}")
                last = e.get("last_configure") or {}
                if last.get("ok") is False and want is not None and not e.get("configuring") and e.get("model") != want:
                    error = last.get("error") or last.get("code") or e.get("last_error") or "?"
                    raise CliError(f"{name} could not take {last.get('model') or want} ({last.get('why')}): {error}"
                                   "\nstopping the pool", EXIT_START_FAILED)
            if seen.get(name) != key:
                seen[name] = key
                if text:
                    self.say(text)
            ready = ready and ok
        return ready, ", ".join(waiting) or "applying the profile"

    def _banner(self, p: Plan, seconds: float, logs: Path | None) -> None:
        assert self.out is not None
        self.out.block(banner(p, seconds, logs, self.events_token_file))

    # --- running

    def _serve(self) -> int:
        while not self.stop_event.wait(POLL_S):
            for c in self.children:
                if c.running() or c.reported:
                    continue
                if c.name == "coordinator":
                    raise CliError(self._died(c, "") + "\nstopping the engines", EXIT_START_FAILED)
                self.say(self._died(c, "while running; the pool goes on without it"))
        self.say("stopping")
        return EXIT_OK

    def stop(self) -> None:
        """SIGTERM every child still running (engines first), wait, SIGKILL what is left."""
        alive = [c for c in reversed(self.children) if c.proc is not None]
        if not alive:
            return
        for c in alive:
            c.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, self.args.stop_timeout)
        for c in alive:
            assert c.proc is not None
            while c.proc.poll() is None and time.monotonic() < deadline and not self.hurry.is_set():
                time.sleep(0.05)
        killed = []
        for c in alive:
            assert c.proc is not None
            if c.proc.poll() is None:
                c.signal_group(signal.SIGKILL)
                killed.append(c.name)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(10)
            if c.pump is not None:
                c.pump.join(2)
            if c.log_file is not None:
                c.log_file.close()
        codes = ", ".join(f"{c.name} {c.proc.returncode}" for c in self.children if c.proc is not None)
        if killed:
            self.say(f"killed {', '.join(killed)} (still running {self.args.stop_timeout:g}s after SIGTERM)")
        self.say(f"stopped ({codes})")
        self.children = []


def banner(p: Plan, seconds: float, logs: Path | None, events_token_file: Path | None = None) -> str:
    """What ``hydractl up`` prints once the pool serves: the endpoint and engines, a first request,
    the exact console command for this pool's ports, and hydractl's commands against it."""
    url = p.http_url
    v1 = f"{url}/v1"
    models = [m for m in p.targets.values() if m]
    model = models[0] if models else "MODEL"
    implicit = url == COORDINATOR_URL and os.environ.get(COORDINATOR_URL_ENV) in (None, "", url)
    at = "" if implicit else f" {url}"
    prog = hydractl_command()

    def c(cmd: str, rest: str = "") -> str:
        return f"{prog} {cmd}{at} {rest}".rstrip()
    other = [n for n in p.profiles if n != p.profile]
    width = max(len(n) for n in p.engine_configs)
    engines = "\n".join(f"  {n:<{width}}  {p.engine_urls[n]}  {p.targets.get(n) or '(no model)'}"
                        for n in p.engine_configs)
    lines = [
        "",
        f"Hydra pool ready in {seconds:.1f}s: profile {p.profile}, endpoint {v1}",
        engines,
        "",
        "A first request (the answer's X-Hydra-Engine header names the engine that served it):",
        f"  curl -i {v1}/chat/completions -H 'Content-Type: application/json' \\",
        f"       -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],"
        f"\"max_tokens\":64}}'",
        f"  python: openai.OpenAI(base_url=\"{v1}\", api_key=\"none\").chat.completions.create(",
        f"              model=\"{model}\", messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}])",
        "",
        "The console of this pool, and hydractl:",
        f"  {console_command(p, events_token_file)}",
        f"  {c('engines')}",
        f"  {c('route', '--explain --model ' + model + ' Hello')}",
        f"  {c('profile', other[0] if other else '')}",
    ]
    if logs is not None:
        lines.append(f"  logs: {display_path(logs)}/<name>.log")
    lines += ["", "Ctrl-C stops the coordinator and every engine.", ""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    return Runner(args).run()

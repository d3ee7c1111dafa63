"""Schema-driven fuzzing of both daemons' HTTP doors with schemathesis, for the reliability program.

Each daemon describes its doors at ``GET /openapi.json`` (:mod:`hydrad.common.openapi`);
schemathesis generates requests from that description (bodies that match the schemas and, in its
negative mode, bodies that break them) and sends them. Its one check here is
``not_a_server_error``; the verdict is ours, read from the HAR report of every request it sent: a
5xx is *expected* only when a door answers it by design (below), and every daemon must be alive and
serve a normal request afterwards.

Expected 5xx (anything else is a failure):

- ``501`` with code ``embeddings_disabled``: an embedding request to an engine whose model is loaded
  without embeddings (the program's engines are), as llama-server answers without ``--embeddings``;
- ``501`` with code ``reranking_disabled``: a ``/rerank`` request to an engine whose model is not loaded
  as a reranker (the program's are not), as llama-server answers without ``--reranking``;
- ``501`` with code ``not_supported``: ``/infill`` on a model without fill-in-the-middle tokens, as
  llama-server;
- ``503`` with an error body (``{"error": {...}}``): the doors' promise allows it (all slots busy and
  the queue full, the unified context full, a model loading or reloading, no engine free).

schemathesis is not a dependency of the project: it is installed on first use into a virtualenv of
its own, ``build/schemathesis-venv`` (made with the running Python's ``-m venv`` and pip), and reused
afterwards. Without it (no network, say) the scenario is reported as skipped, not failed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tests.support.engine import REPO

VENV = REPO / "build" / "schemathesis-venv"
REQUIREMENT = "schemathesis==4.32.5"
"""Pinned: the CLI options and the report formats read below are this version's."""
EXPECTED_501 = frozenset({"embeddings_disabled", "reranking_disabled", "not_supported"})

ENGINE_EXCLUDED = ("post_control_configure", "post_control_swap_quant", "post_control_set_expert_mode",
                   "post_slots_slot", "put_slots_slot_state")
"""The engine's doors that change its model or its slots (reload, quantization swap, expert mode, slot
save/restore/erase, a KV upload): what they do with a valid body is reconfigure the engine the other
scenarios need as it is. Their parsers are covered by tests/property and scripts/fuzz_parsers.py. The
program's pool sets no engine token (``rpc.token_file``), so the engine's read-only control and slot
doors are open to loopback and fuzzed like the rest."""
FRONT_EXCLUDED = ("post_admin_profile", "post_admin_sessions_move")
"""The coordinator's doors that change the pool (a profile switch, a session moved between engines)."""


class Unavailable(Exception):
    """schemathesis could not be installed or started; the reason says why."""


@dataclass
class DoorRun:
    """What one schemathesis run against one daemon found."""

    name: str
    url: str
    exit_code: int | None = None
    seconds: float = 0.0
    operations: int = 0
    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # "2xx", "4xx", "5xx" ...; "none": no answer in time
    cut: bool = False  # schemathesis ran past its budget and was stopped (what it had sent still counts)
    server_errors: Counter[str] = field(default_factory=Counter)  # "501 embeddings_disabled": n
    unexpected: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # a few unexpected ones: method, path, status, body
    problems: list[str] = field(default_factory=list)  # the run itself went wrong

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operations": self.operations, "requests": self.requests,
                               "statuses": dict(sorted(self.statuses.items())),
                               "5xx": dict(sorted(self.server_errors.items())) or 0,
                               "unexpected_5xx": sum(self.unexpected.values()), "seconds": round(self.seconds)}
        if self.cut:
            out["cut_at_budget"] = True
        return out


def _lock() -> Any:
    VENV.parent.mkdir(parents=True, exist_ok=True)
    f = open(VENV.parent / f"{VENV.name}.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _version(exe: Path) -> str | None:
    try:
        p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def install(log: Callable[[str], None] = lambda _: None, timeout: float = 900.0) -> Path:
    """The schemathesis executable of ``build/schemathesis-venv``, made first if it is not there yet
    (or not the pinned version); :class:`Unavailable` when that fails."""
    exe = VENV / "bin" / "schemathesis"
    wanted = REQUIREMENT.partition("==")[2]
    with _lock():
        have = _version(exe)
        if have and wanted in have:
            return exe
        log(f"installing {REQUIREMENT} into {VENV}")
        steps = [[sys.executable, "-m", "venv", "--clear", str(VENV)],
                 [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  "--no-input", REQUIREMENT]]
        for argv in steps:
            try:
                p = subprocess.run(["nice", "-n", "10", *argv], capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise Unavailable(f"{Path(argv[2] if argv[1] == '-m' else argv[0]).name}: {exc}") from None
            if p.returncode != 0:
                lines = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
                raise Unavailable((lines[-1] if lines else f"exit {p.returncode}")[:300])
        have = _version(exe)
        if not have:
            raise Unavailable("installed, but `schemathesis --version` does not run")
        return exe


def _error_code(text: str | None) -> str:
    """The ``error.code`` (OpenAI's shape) or ``error.type`` (Anthropic's) of an error body; ``-`` when
    the body is no error JSON."""
    try:
        err = json.loads(text or "")["error"]
        return str(err.get("code") or err.get("type") or "?")
    except (ValueError, KeyError, TypeError, AttributeError):
        return "-"


def expected(status: int, code: str) -> bool:
    """Whether a 5xx is one the doors answer by design (the module's list)."""
    if status == 501:
        return code in EXPECTED_501
    return status == 503 and code != "-"


def har_entries(path: Path) -> list[dict[str, Any]]:
    """The entries of a HAR report, also of one cut short (schemathesis writes it as it goes, and
    closes it only at the end of a run)."""
    text = path.read_text(errors="replace")
    start = text.find('"entries": [')
    if start < 0:
        return []
    i, decoder, out = start + len('"entries": ['), json.JSONDecoder(), []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            entry, i = decoder.raw_decode(text, i)
        except ValueError:
            return out
        out.append(entry)


def read_har(path: Path, run: DoorRun) -> None:
    """Counts every request of schemathesis's HAR report into ``run``; a request that got no answer
    (past ``--request-timeout``) has status 0 there."""
    for e in har_entries(path):
        run.requests += 1
        status = int(e.get("response", {}).get("status") or 0)
        run.statuses[f"{status // 100}xx" if status else "none"] += 1
        if status < 500:
            continue
        content = e["response"].get("content") or {}
        text = content.get("text")
        if content.get("encoding") == "base64" and text:
            text = base64.b64decode(text).decode("utf-8", "replace")
        code = _error_code(text)
        key = f"{status} {code}"
        run.server_errors[key] += 1
        if not expected(status, code):
            run.unexpected[key] += 1
            if len(run.examples) < 5:
                req = e.get("request", {})
                run.examples.append(f"{req.get('method')} {urlsplit(req.get('url', '')).path} -> {status}: "
                                    f"{(text or '')[:200]!r}; body {str((req.get('postData') or {}).get('text'))[:200]!r}")


def read_operations(console: str, junit: Path, run: DoorRun) -> None:
    """The operations tested: from the console's "Operations: N selected / M total", else from the
    JUnit report (one test case each; written only at the end of a whole run)."""
    m = re.search(r"Operations:\s+(\d+) selected", console)
    if m:
        run.operations = int(m.group(1))
    elif junit.exists() and junit.stat().st_size:
        run.operations = len(ET.parse(junit).getroot().findall(".//testcase"))


def fuzz(exe: Path, name: str, url: str, out: Path, *, max_examples: int, seed: int, exclude: tuple[str, ...],
         request_timeout: float = 30.0, budget: float = 900.0, log: Callable[[str], None] = lambda _: None) -> DoorRun:
    """One ``schemathesis run`` of ``url``/openapi.json, niced, its reports in ``out``; what it found.
    Every 5xx is also a failure to schemathesis's own check: the verdict is taken from the HAR report.
    No shrinking: a failing case is reported as it was found, not sent again and again while it is
    made smaller (a generation that runs past the request timeout would cost that timeout each time);
    and an operation is fuzzed on after its first failure (the embedding doors fail at once by design,
    with their 501, and would otherwise be tested no further). Past ``budget`` seconds the run is stopped and what it had sent is read all the same."""
    run = DoorRun(name, url)
    out.mkdir(parents=True, exist_ok=True)
    argv = ["nice", "-n", "10", str(exe), "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
            "--max-examples", str(max_examples), "--seed", str(seed), "--request-timeout", str(request_timeout),
            "--workers", "1", "--no-shrink", "--continue-on-failure", "--generation-database", "none", "--no-color",
            "--report", "junit,har", "--report-dir", str(out), "--report-har-path", str(out / "requests.har"),
            "--report-junit-path", str(out / "junit.xml")]
    for op in exclude:
        argv += ["--exclude-operation-id", op]
    log(f"schemathesis {name}: {' '.join(argv[3:])}")
    t0 = time.monotonic()
    with open(out / "schemathesis.log", "w") as console:
        p = subprocess.Popen(argv, stdout=console, stderr=subprocess.STDOUT, cwd=str(out), start_new_session=True,
                             env=dict(os.environ, NO_COLOR="1"))
        try:
            run.exit_code = p.wait(budget)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
            run.cut = True
            log(f"schemathesis {name}: stopped at its {budget:.0f} s budget")
    run.seconds = time.monotonic() - t0
    har, junit = out / "requests.har", out / "junit.xml"
    console_text = (out / "schemathesis.log").read_text(errors="replace")
    if not har.exists():
        run.problems.append(f"schemathesis wrote no HAR report (exit {run.exit_code}): {console_text[-1500:]}")
        return run
    read_har(har, run)
    read_operations(console_text, junit, run)
    if not run.requests:
        run.problems.append(f"schemathesis sent no request (exit {run.exit_code}): {console_text[-1500:]}")
    return run


# ----- the reliability program's scenario ---------------------------------------------------------

IDLE_S = 10.0
"""After a run, how long the pool may take to be idle: no slot busy, nothing queued or in flight."""
GOAL = ("0 unexpected 5xx from schemathesis's requests at an engine's own door and at the front door (expected: "
        "501 embeddings_disabled / reranking_disabled / not_supported, 503 with error JSON); every daemon alive afterwards, the pool "
        f"idle within {IDLE_S:.0f} s and a normal request served by both doors")


def busy(pool: Any) -> dict[str, int]:
    """What is still going on in the pool: busy slots and queued requests per engine (its own
    /slots and /health) and the requests the coordinator counts in flight; empty when idle."""
    import httpx
    out: dict[str, int] = {}
    for name, url in pool.engine_http.items():
        slots = httpx.get(url + "/slots", timeout=5).json()
        queued = (httpx.get(url + "/health", timeout=5).json().get("slots") or {}).get("queued", 0)
        n = sum(1 for s in slots if s.get("is_processing")) + int(queued or 0)
        if n:
            out[name] = n
    if pool.inflight():
        out["coordinator in flight"] = pool.inflight()
    return out


def scenario(pool: Any, max_examples: int, seed: int = 1, budget: float = 900.0,
             log: Callable[[str], None] = lambda _: None) -> Any:
    """schemathesis against ``rel-a``'s own door, then against the front door (the doors listed in
    ENGINE_EXCLUDED and FRONT_EXCLUDED left out); a Result of :mod:`tests.support.faultscenarios`."""
    from tests.support import faultscenarios as S
    from tests.support.faultpool import ENGINES, wait_for
    from tests.support.streamcheck import chat_once

    res = S.Result("schema-driven fuzzing (schemathesis)", GOAL)
    t0 = time.monotonic()
    try:
        exe = install(log)
    except Unavailable as exc:
        res.figures = {"skipped": f"schemathesis not installable ({exc})"}
        res.seconds = round(time.monotonic() - t0, 1)
        return res
    engine = ENGINES[0]
    doors = [(engine, pool.engine_http[engine], ENGINE_EXCLUDED), ("front door", pool.url, FRONT_EXCLUDED)]
    normal = {"model": S.MODEL, "max_tokens": 8, "temperature": 0,
              "messages": [{"role": "user", "content": "Say hello."}]}
    doors_of_pool = [(engine, pool.engine_http[engine]), ("front door", pool.url)]
    res.figures["max_examples"] = max_examples
    res.figures["seed"] = seed
    for name, url, exclude in doors:
        run = fuzz(exe, name, url, pool.root / "schemathesis" / name.replace(" ", "-"), max_examples=max_examples,
                   seed=seed, exclude=exclude, budget=budget, log=log)
        res.figures[name] = run.figures()
        log(f"schemathesis {name}: {json.dumps(run.figures())}")
        for problem in run.problems:
            res.fail(f"{name}: {problem}")
        if run.unexpected:
            res.fail(f"{name}: unexpected 5xx {dict(run.unexpected)}; e.g. " + " | ".join(run.examples[:3]))
        dead = [d for d in [pool.coordinator, *pool.engines.values()] if not d.alive()]
        for d in dead:
            res.fail(f"{d.name} died during the run against {name}: {d.log_tail(1500)}")
        if dead:
            S.heal(pool)
            continue
        try:
            res.figures[name]["idle_after_s"] = round(wait_for("the pool idle", lambda: not busy(pool), IDLE_S, 0.2)[1], 1)
        except TimeoutError:
            res.fail(f"after the run against {name}, the pool was not idle within {IDLE_S:.0f} s: {busy(pool)}")
        served = {door: chat_once(u, normal, 60)[0] for door, u in doors_of_pool}
        res.figures[name]["normal_request_after"] = served
        for door, status in served.items():
            if status != 200:
                res.fail(f"after the run against {name}, a normal request at {door} got {status or 'no answer'}")
    try:
        S.heal(pool)
    except (TimeoutError, RuntimeError) as exc:
        res.fail(f"not healed: {exc}")
    res.seconds = round(time.monotonic() - t0, 1)
    return res

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import GEMMA, SMOLLM, Engine, models_dir, sibling_quant

TESTS = Path(__file__).resolve().parent

# What a test needs, told by its markers (declared in pyproject.toml) so that a tier can leave it
# out: ``scripts/test --quick`` runs what needs none of model, daemon, systemd, gpu and is not slow.
# They are set here from where a test lives and which fixtures it uses, not written on each test.
MODEL_FIXTURES = {"smollm_path", "gemma_path", "smollm_engine", "shared_smollm_engine", "smollm_q8", "solo_pool",
                  "real_states", "engine_door", "front_door", "door"}
DAEMON_FIXTURES = {"start_engine", "start_module_engine", "smollm_engine", "shared_smollm_engine", "solo_pool",
                   "engine_door", "front_door", "door"}
DIRECTORY_MARKS = {"integration": ("daemon",), "system": ("daemon", "model", "systemd")}
# pytest-xdist (--dist loadgroup): the tests of one group run on one worker, so a fixture shared by a
# module or the session is made once. Tests that need a model, a daemon or a systemd are grouped by
# their file; these session fixtures make one group of every test that uses them, whatever its file.
SESSION_GROUPS = {"real_states": "kv-states"}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker (and every daemon it starts) keeps to its own share of the CPUs.

    A daemon's ``n_threads: 0`` means every CPU it may use; with two workers each booting engines
    that take every core, llama.cpp's threads spin against each other on the same cores and a
    test that takes 5 s alone took minutes. Pinned, an engine sizes its threads to its worker's
    share, as it would under a systemd unit's ``CPUAffinity=``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    index = int(worker[2:])
    # as many workers as CPUs or fewer: each its own CPUs; more: each one CPU, taken in turn, so two
    # workers share a core rather than every worker's engines spinning on every core
    share = cpus[index % count::count] if len(cpus) >= count else [cpus[index % len(cpus)]]
    if share:
        os.sched_setaffinity(0, share)


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist = config.pluginmanager.hasplugin("xdist")
    gpu = None
    for item in items:
        try:
            rel = item.path.resolve().relative_to(TESTS)
        except ValueError:  # a test file outside tests/
            rel = Path(item.path.name)
        fixtures = set(getattr(item, "fixturenames", ()))
        need = set(DIRECTORY_MARKS.get(rel.parts[0], ()))
        if fixtures & MODEL_FIXTURES:
            need.add("model")
        if fixtures & DAEMON_FIXTURES:
            need.add("daemon")
        for name in sorted(need - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
        if xdist and not item.get_closest_marker("xdist_group"):
            group = next((g for f, g in SESSION_GROUPS.items() if f in fixtures), None)
            if group is None and any(item.get_closest_marker(m) for m in ("model", "daemon", "systemd", "slow")):
                group = rel.as_posix()
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("gpu"):
            gpu = _has_gpu() if gpu is None else gpu
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)"))


def _need(file: str) -> Path:
    p = models_dir() / file
    if not p.is_file():
        pytest.skip(f"model file {p} is missing (scripts/setup fetches it)")
    return p


@pytest.fixture
def smollm_path() -> Path:
    return _need(SMOLLM)


@pytest.fixture
def gemma_path() -> Path:
    return _need(GEMMA)


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Start real hydrad subprocesses; every one is stopped (SIGTERM, then kill) at teardown."""
    started: list[Engine] = []

    def start(**kw: object) -> Engine:
        e = Engine(tmp_path, **kw)  # type: ignore[arg-type]
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


@pytest.fixture
def smollm_engine(smollm_path: Path, start_engine: Callable[..., Engine]) -> Engine:
    """An engine serving SmolLM2-135M (loaded at boot from the YAML defaults)."""
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0})
    e.wait_ready()
    return e


@pytest.fixture(scope="module")
def start_module_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Engine]]:
    """``start_engine`` for the engines a module's tests share: each in a directory of its own, stopped
    after the module's last test. For tests that change nothing in the engine (a refused request, a
    read), where a boot per test (one to several seconds, with its model load) would be the test's cost."""
    started: list[Engine] = []

    def start(**kw: object) -> Engine:
        e = Engine(tmp_path_factory.mktemp("engine"), **kw)  # type: ignore[arg-type]
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


@pytest.fixture(scope="module")
def shared_smollm_engine(start_module_engine: Callable[..., Engine]) -> Engine:
    """``smollm_engine``, booted once for the module: for tests whose requests it refuses or that only read."""
    _need(SMOLLM)
    e = start_module_engine(defaults={"model": "smollm2-135m", "temperature": 0})
    e.wait_ready()
    return e


@pytest.fixture
def smollm_q8(smollm_path: Path, tmp_path: Path) -> Path:
    """A sibling quant of SmolLM2 made with llama.cpp's own quantizer (Q4_1 → Q8_0)."""
    return sibling_quant(smollm_path, tmp_path / "SmolLM2-135M-Instruct.Q8_0.gguf")


SOLO_PROFILES = {"profiles": {"one": {"description": "one SmolLM2 engine",
                                      "engines": {"solo": {"model": "smollm2-135m", "params": {"n_parallel": 2}}}}},
                 "default": "one"}


@pytest.fixture
def solo_pool(tmp_path: Path, smollm_path: Path,
              start_engine: Callable[..., Engine]) -> Iterator[tuple[Coordinator, Engine]]:
    """A coordinator and one greedy SmolLM2 engine ``solo`` on its bus: a request checked at the front
    door against the same request sent to the engine itself."""
    c, e = start_solo_pool(tmp_path, start_engine)
    yield c, e
    c.stop()


def start_solo_pool(tmp_path: Path, start_engine: Callable[..., Engine],
                    **coordinator: Any) -> tuple[Coordinator, Engine]:
    """A coordinator (``coordinator``: more of its arguments) and the greedy SmolLM2 engine ``solo``, serving."""
    c = Coordinator(tmp_path, profiles=SOLO_PROFILES, heartbeat_interval_s=0.5, **coordinator)
    c.wait_ready()
    e = start_engine(name="solo", defaults={"n_ctx": 2048, "n_threads": 1, "temperature": 0},
                     extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("solo", {}).get("model") == "smollm2-135m"
                   and es["solo"].get("stage") == "ready", timeout=120)
    return c, e

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import GEMMA, SMOLLM, Engine, models_dir, sibling_quant


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

"""One engine ``solo`` serving a model behind a coordinator, for tests that ask both doors the same
thing: started once for a module (``module_pool``), its doors by name (``doors``: HTTP clients,
``urls``: base URLs for SDK clients), and the two ways to ask a door (``post``, ``streamed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import SMOLLM, Engine, models_dir


class SoloPool:
    """A coordinator whose profile puts ``model`` on engine ``solo``, and that engine on its bus."""

    def __init__(self, tmp: Path, model: str = "smollm2-135m", defaults: dict[str, Any] | None = None,
                 **coordinator: Any) -> None:
        profiles = {"profiles": {"one": {"description": "one engine", "engines": {"solo": {"model": model}}}},
                    "default": "one"}
        self.coordinator = Coordinator(tmp, profiles=profiles, heartbeat_interval_s=0.5, **coordinator)
        try:
            self.coordinator.wait_ready()
            self.engine = Engine(tmp, name="solo", defaults={"n_parallel": 1, "n_threads": 1, **(defaults or {})},
                                 extra={"bus": self.coordinator.engine_bus(heartbeat_interval_s=0.5)})
            self.coordinator.wait_serving({"solo": model}, timeout=180)
        except BaseException:
            self.stop()
            raise
        self.doors: dict[str, httpx.Client] = {"engine": self.engine.http, "coordinator": self.coordinator.http}
        self.urls = {"engine": self.engine.url, "coordinator": self.coordinator.url}

    def stop(self) -> None:
        if hasattr(self, "engine"):
            self.engine.stop()
        self.coordinator.stop()


def module_pool(tmp_path_factory: pytest.TempPathFactory, name: str, model_file: str = SMOLLM,
                **kw: Any) -> Iterator[SoloPool]:
    """A module fixture's body: the pool, skipped when the model file is missing, stopped afterwards."""
    if not (models_dir() / model_file).is_file():
        pytest.skip(f"model file {model_file} is missing (scripts/setup fetches it)")
    pool = SoloPool(tmp_path_factory.mktemp(name), **kw)
    yield pool
    pool.stop()


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The JSON answer of a request that must succeed."""
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def streamed(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The data events of a stream, decoded ([DONE] left out)."""
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    blocks = [b[len("data: "):] for b in raw.split("\n\n") if b.startswith("data: ")]
    return [json.loads(b) for b in blocks if b != "[DONE]"]

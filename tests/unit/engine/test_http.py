"""Engine HTTP handlers are module-level functions: one mounted on an app of its own, with a
stand-in core behind the ``HttpContext``, answers like the engine's."""

from __future__ import annotations

from types import SimpleNamespace

from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from hydrad.engine.http.app import health, models, on_api_error, slots
from hydrad.engine.http.context import HttpContext
from hydrad.engine.pairing import Pairing
from hydrad.engine.settings import EngineSettings
from hydrad.engine.snapshot import EngineSnapshot
from hydrad.wire.openai import ApiError


def client(snap: EngineSnapshot, rows: list[dict] | None = None, slots_endpoint: bool = True) -> TestClient:
    core = SimpleNamespace(snapshot=lambda: snap, slot_rows=lambda: rows or [], pairing=Pairing())
    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models), Route("/slots", slots)],
                    exception_handlers={ApiError: on_api_error})
    settings = EngineSettings(name="solo", http={"slots_endpoint": slots_endpoint})
    app.state.ctx = HttpContext(settings, SimpleNamespace(core=core))  # type: ignore[arg-type]
    return TestClient(app)


def test_health_of_an_idle_engine_is_503_without_retry_after() -> None:
    r = client(EngineSnapshot(stage="idle", alive=True, slots_total=0)).get("/health")
    assert r.status_code == 503 and "retry-after" not in r.headers
    assert r.json() == {"stage": "idle", "engine": "solo", "slots": {"busy": 0, "total": 0, "queued": 0},
                        "mode": "solo", "role": "solo", "status": "idle"}


def test_dead_engine_thread_is_an_error() -> None:
    r = client(EngineSnapshot(stage="ready", alive=False)).get("/health")
    assert r.status_code == 503 and r.json()["status"] == "error"


def test_slots_and_models_without_a_model() -> None:
    c = client(EngineSnapshot(stage="idle", alive=True),
               rows=[{"id": 0, "n_ctx": 512, "busy": True, "n_tokens": 7, "n_prompt": 5, "n_decoded": 2, "speculative": True,
                      "draft_n": 9, "draft_n_accepted": 4}])
    assert c.get("/slots").json() == [{"id": 0, "n_ctx": 512, "is_processing": True, "n_tokens": 7, "speculative": True, "n_prompt": 5,
                                       "n_decoded": 2, "draft_n": 9, "draft_n_accepted": 4}]
    assert c.get("/v1/models").json() == {"object": "list", "data": []}


def test_slots_turned_off_answers_501_naming_the_setting() -> None:
    r = client(EngineSnapshot(stage="idle", alive=True), slots_endpoint=False).get("/slots")
    assert r.status_code == 501 and "slots_endpoint" in r.json()["error"]["message"], r.text

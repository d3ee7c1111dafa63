"""A real engine started with cors_origins answers a browser's preflight on inference, not on control."""

from __future__ import annotations

from typing import Callable

from tests.support.engine import Engine

PREFLIGHT = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type"}


def test_engine_cors_for_configured_origins_on_inference_only(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(extra={"http": {"cors_origins": ["http://localhost:5173"]}})
    e.notify.wait_for("READY=1", 60)
    pre = e.http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:5173"
    r = e.http.post("/tokenize", json={"content": "x"}, headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 503 and r.headers["access-control-allow-origin"] == "http://localhost:5173"  # no model
    ctl = e.http.options("/control/configure", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in ctl.headers

"""CORS on the inference endpoints only, for configured origins only."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from hydrad.common.cors import check_origins, with_cors
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.engine.settings import EngineSettings


async def ok(_: object) -> JSONResponse:
    return JSONResponse({"ok": True})


APP = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in
                        ("/v1/chat/completions", "/tokenize", "/control/configure", "/slots/0/state", "/admin/engines")])
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}


def test_preflight_and_answers_carry_cors_for_an_allowed_origin_on_inference_paths() -> None:
    c = TestClient(with_cors(APP, ["https://ui.example"]))
    for path in ("/v1/chat/completions", "/tokenize"):
        pre = c.options(path, headers={"Origin": "https://ui.example", **PREFLIGHT})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://ui.example"
        r = c.post(path, headers={"Origin": "https://ui.example"})
        assert r.headers["access-control-allow-origin"] == "https://ui.example"
        # another origin's preflight is answered (as llama-server answers it) and granted nothing
        other = c.options(path, headers={"Origin": "https://evil.example", **PREFLIGHT})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("path", ["/control/configure", "/slots/0/state", "/admin/engines"])
def test_control_surfaces_never_answer_cors(path: str) -> None:
    c = TestClient(with_cors(APP, ["*"]))
    pre = c.options(path, headers={"Origin": "https://ui.example", **PREFLIGHT})
    assert "access-control-allow-origin" not in pre.headers and pre.status_code == 405
    assert "access-control-allow-origin" not in c.post(path, headers={"Origin": "https://ui.example"}).headers


def test_no_origins_no_cors() -> None:
    c = TestClient(with_cors(APP, []))
    pre = c.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000", **PREFLIGHT})
    assert pre.status_code == 200 and not any(k.startswith("access-control-") for k in pre.headers)
    assert not any(k.startswith("access-control-") for k in c.post("/tokenize", headers={"Origin": "http://x"}).headers)


@pytest.mark.parametrize("origin", ["http://localhost", "http://localhost:8080", "https://127.0.0.1",
                                    "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"])
def test_localhost_allows_every_loopback_origin(origin: str) -> None:
    c = TestClient(with_cors(APP, ["localhost"]))
    pre = c.options("/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost",
                                    "http://localhost.evil.com", "http://127.0.0.1.evil.com", "http://[::1].x"])
def test_localhost_allows_nothing_else(origin: str) -> None:
    c = TestClient(with_cors(APP, ["localhost"]))
    pre = c.options("/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})
    assert pre.status_code == 200 and "access-control-allow-origin" not in pre.headers


@pytest.mark.parametrize("bad", ["ui.example", "ftp://x", "https://x/path", "https://x y", ""])
def test_origins_are_checked_in_both_daemons_settings(bad: str) -> None:
    with pytest.raises(ValueError):
        check_origins([bad])
    with pytest.raises(ValueError):
        EngineSettings(http={"cors_origins": [bad]})
    with pytest.raises(ValueError):
        CoordinatorSettings(http={"cors_origins": [bad]})
    assert EngineSettings(http={"cors_origins": ["http://localhost:5173", "*"]}).http.cors_origins[1] == "*"
    assert EngineSettings(http={"cors_origins": ["localhost"]}).http.cors_origins == ["localhost"]

"""The optional API key: inference behind it, health/models/metrics and the control surfaces not."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from hydrad.common import apikey, tokenfile
from hydrad.common.yamlfile import ConfigError
from hydrad.engine.settings import load_config

KEY = "k" * 32


async def ok(_: object) -> JSONResponse:
    return JSONResponse({"ok": True})


PATHS = ("/v1/chat/completions", "/completions", "/tokenize", "/health", "/v1/models", "/metrics",
         "/control/configure", "/slots/0/state", "/admin/engines", "/slots")
APP = Starlette(routes=[Route(p, ok, methods=["GET", "POST", "OPTIONS"]) for p in PATHS])


def test_inference_needs_the_key_and_nothing_else_does() -> None:
    c = TestClient(apikey.with_api_key(APP, KEY))
    for path in ("/v1/chat/completions", "/completions", "/tokenize"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"bearer {KEY}x"}):
            r = c.post(path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, headers)
            assert r.headers["www-authenticate"].startswith("Bearer")
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme's case is free (RFC 9110)
            assert c.post(path, headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200, scheme
        assert c.post(path, headers={"Authorization": f"Basic {KEY}"}).status_code == 401
        assert c.post(path, headers={"x-api-key": KEY}).status_code == 200  # Anthropic SDKs' header
        for bad in ("", f"Bearer {KEY}", KEY + "x", KEY[:-1]):
            assert c.post(path, headers={"x-api-key": bad}).status_code == 401, bad
        assert c.options(path).status_code == 200  # a browser's preflight carries no credentials
    for path in ("/health", "/v1/models", "/metrics", "/control/configure", "/slots/0/state", "/admin/engines"):
        assert c.post(path).status_code == 200, path
    # what the slots are doing is pool state: read only with the key
    assert c.get("/slots").status_code == 401 and c.get("/slots", headers={"x-api-key": KEY}).status_code == 200
    assert apikey.with_api_key(APP, None) is APP


def test_the_key_comes_from_the_file_else_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(apikey.ENV_API_KEY, raising=False)
    assert apikey.api_key(None) is None
    monkeypatch.setenv(apikey.ENV_API_KEY, KEY)
    assert apikey.api_key(None) == KEY
    f = tmp_path / "api.key"
    tokenfile.write_token(f, "f" * 20)
    assert apikey.api_key(f) == "f" * 20  # the file wins
    monkeypatch.setenv(apikey.ENV_API_KEY, "short")
    with pytest.raises(tokenfile.TokenError, match="HYDRA_API_KEY"):
        apikey.api_key(None)


def test_a_bad_key_file_is_a_config_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(apikey.ENV_API_KEY, raising=False)
    cfg = tmp_path / "e.yaml"
    cfg.write_text("name: e\nhttp: {api_key_file: missing.key}\n")
    with pytest.raises(ConfigError, match="http.api_key_file.*missing.key"):
        load_config(cfg)
    (tmp_path / "missing.key").write_text("k" * 24 + "\n")
    assert load_config(cfg).settings.http.api_key_file == (tmp_path / "missing.key").resolve()

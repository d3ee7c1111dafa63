"""The browser-origin defence's rules, on scopes as uvicorn makes them (the daemons' own doors are
attacked for real in tests/integration/test_browser_attacks.py)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from hydrad.common.apikey import InferenceAccess
from hydrad.common.browser import BrowserGuard, HostCheck


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _call(guard: BrowserGuard, method: str, path: str, **headers: str) -> tuple[int, dict[str, Any] | None, dict[bytes, bytes]]:
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(guard(scope, receive, send))
    body = sent[1]["body"]
    return sent[0]["status"], (json.loads(body) if body != b"ok" else None), dict(sent[0]["headers"])


def guard(cors: list[str] | None = None, hosts: list[str] | None = None, listen: str = "127.0.0.1") -> BrowserGuard:
    return BrowserGuard(_ok, listen_host=listen, allowed_hosts=hosts or [], cors_origins=cors or [])


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "[::1]:8080", "localhost:8080", "LOCALHOST.:9000", "10.1.2.3",
                                  "app.localhost:8080", socket.gethostname() + ":8080"])
def test_local_names_and_addresses_are_answered(host: str) -> None:
    assert _call(guard(), "GET", "/health", host=host)[0] == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io"])
def test_a_foreign_host_name_is_refused_on_every_method(host: str) -> None:
    for method in ("GET", "POST", "OPTIONS"):
        status, body, headers = _call(guard(), method, "/v1/models", host=host, content_type="application/json")
        assert status == 403 and body is not None and body["error"]["code"] == "host_not_allowed", (method, body)
        assert headers[b"connection"] == b"close"


def test_configured_names_domains_and_star() -> None:
    g = guard(hosts=["gpu1.lan", ".example.com"])
    assert _call(g, "GET", "/health", host="gpu1.lan:8080")[0] == 200
    assert _call(g, "GET", "/health", host="a.b.example.com")[0] == 200
    assert _call(g, "GET", "/health", host="example.com.evil")[0] == 403
    assert _call(guard(listen="box.internal"), "GET", "/health", host="box.internal:9000")[0] == 200
    assert _call(guard(hosts=["*"]), "GET", "/health", host="anything.example")[0] == 200
    assert HostCheck("0.0.0.0", []).allows("[fe80::1]:8080")


@pytest.mark.parametrize("path", ["/admin/profile", "/control/configure", "/v1/chat/completions", "/slots/0?action=erase"])
@pytest.mark.parametrize("ctype", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/json"])
def test_a_cross_site_post_is_refused_whatever_its_type(path: str, ctype: str) -> None:
    status, body, _ = _call(guard(), "POST", path, host="127.0.0.1:9000", origin="http://evil.example",
                            content_type=ctype)
    assert status == 403 and body is not None and body["error"]["code"] == "cross_origin"


def test_fetch_metadata_without_origin_and_the_null_origin_are_foreign() -> None:
    for headers in ({"sec_fetch_site": "cross-site"}, {"sec_fetch_site": "same-site"}, {"origin": "null"},
                    {"origin": "http://[::1"}, {"origin": "http://[x]:99999"}):
        status, body, _ = _call(guard(cors=["http://localhost:5173"]), "POST", "/v1/completions",
                                host="127.0.0.1:9000", content_type="application/json", **headers)
        assert status == 403 and body is not None and body["error"]["code"] == "cross_origin", headers
    for site in ("same-origin", "none"):
        assert _call(guard(), "POST", "/v1/completions", host="127.0.0.1:9000", sec_fetch_site=site,
                     content_type="application/json")[0] == 200


def test_same_origin_and_configured_origins() -> None:
    assert _call(guard(), "POST", "/admin/profile", host="127.0.0.1:9000", origin="http://127.0.0.1:9000",
                 content_type="application/json")[0] == 200
    assert _call(guard(), "POST", "/v1/completions", host="localhost", origin="http://localhost:80",
                 content_type="application/json")[0] == 200
    cors = guard(cors=["http://localhost:5173"])
    assert _call(cors, "POST", "/v1/chat/completions", host="127.0.0.1:9000", origin="http://localhost:5173",
                 content_type="application/json")[0] == 200
    # CORS is for inference: a configured origin still may not touch a control surface
    for path in ("/admin/profile", "/control/configure", "/slots/0"):
        assert _call(cors, "POST", path, host="127.0.0.1:9000", origin="http://localhost:5173",
                     content_type="application/json")[0] == 403
    assert _call(guard(cors=["*"]), "POST", "/v1/chat/completions", host="127.0.0.1:9000",
                 origin="http://anywhere.example", content_type="application/json")[0] == 200
    # llama-server's keyword: every loopback origin of any port, nothing that only starts like one
    loop = guard(cors=["localhost"])
    for origin in ("http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]"):
        assert _call(loop, "POST", "/v1/chat/completions", host="127.0.0.1:9000", origin=origin,
                     content_type="application/json")[0] == 200, origin
    for origin in ("http://localhost.evil.com", "http://notlocalhost", "http://evil.com"):
        assert _call(loop, "POST", "/v1/chat/completions", host="127.0.0.1:9000", origin=origin,
                     content_type="application/json")[0] == 403, origin
    assert _call(loop, "POST", "/control/configure", host="127.0.0.1:9000", origin="http://localhost:5173",
                 content_type="application/json")[0] == 403


@pytest.mark.parametrize("ctype", ["text/plain", "Text/Plain; charset=utf-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=----x"])
def test_simple_content_types_are_refused_even_without_an_origin(ctype: str) -> None:
    status, body, _ = _call(guard(), "POST", "/admin/profile", host="127.0.0.1:9000", content_type=ctype)
    assert status == 415 and body is not None and body["error"]["code"] == "unsupported_media_type"
    assert "application/json" in body["error"]["message"]


def test_json_no_type_and_binary_bodies_pass_and_safe_methods_need_no_origin_check() -> None:
    g = guard()
    assert _call(g, "POST", "/v1/completions", host="127.0.0.1:9000", content_type="application/json")[0] == 200
    assert _call(g, "POST", "/v1/completions", host="127.0.0.1:9000")[0] == 200
    assert _call(g, "PUT", "/slots/0/state", host="127.0.0.1:9000", content_type="application/octet-stream")[0] == 200
    assert _call(g, "GET", "/v1/models", host="127.0.0.1:9000", origin="http://evil.example")[0] == 200
    assert _call(g, "POST", "/v1/models")[0] == 200  # HTTP/1.0: no Host header at all


def test_allowed_hosts_setting_is_checked() -> None:
    assert InferenceAccess(allowed_hosts=["GPU1.lan.", ".Example.com", "*"]).allowed_hosts == ["gpu1.lan", ".example.com", "*"]
    for bad in ["", "http://x", "a b", "x:80"]:
        with pytest.raises(ValueError):
            InferenceAccess(allowed_hosts=[bad])

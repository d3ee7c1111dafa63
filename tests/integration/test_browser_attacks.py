"""A hostile web page against a real pool as ``scripts/run`` starts it (no tokens, no API key):
every state-changing route of both doors, read from their own /openapi.json, refuses the
cross-site requests a browser sends without a preflight, and a foreign ``Host`` (DNS rebinding)
is refused everywhere. The same requests from a script (no ``Origin``, JSON) still reach the routes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import httpx

from tests.conftest import SOLO_PROFILES
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

EVIL = "http://evil.example"
BROWSER = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
SIMPLE = [("text/plain;charset=UTF-8", b'{"name": "one"}'),
          ("application/x-www-form-urlencoded", b"name=one"),
          ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="name"\r\n\r\none\r\n--x--\r\n')]


def _changing_routes(http: httpx.Client) -> list[tuple[str, str]]:
    """(method, path) of every route that is not GET, as the door describes itself; path
    parameters filled with 0."""
    paths = http.get("/openapi.json").json()["paths"]
    out = [(m.upper(), re.sub(r"\{[^}]+\}", "0", p)) for p, ops in paths.items() for m in ops if m not in ("get", "head")]
    assert len(out) >= 8, out
    return out


def _attack(http: httpx.Client, routes: list[tuple[str, str]]) -> None:
    for method, path in routes:
        for ctype, body in SIMPLE:
            r = http.request(method, path, content=body, headers={**BROWSER, "Content-Type": ctype})
            assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", (method, path, ctype, r.text)
            assert r.headers["connection"] == "close"
        # a page's same request without Origin (an old browser) still has a type a page may send
        r = http.request(method, path, content=SIMPLE[0][1], headers={"Content-Type": SIMPLE[0][0]})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (method, path, r.text)
    for path in ("/health", "/v1/models", "/openapi.json"):
        r = http.get(path, headers={"Host": "evil.example:9000"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (path, r.text)
    r = http.post(routes[0][1], json={}, headers={"Host": "rebound.evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"


def test_a_web_page_cannot_steer_or_read_the_pool(tmp_path: Path, smollm_path: Path,
                                                  start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles={**SOLO_PROFILES, "profiles": {
        **SOLO_PROFILES["profiles"], "two": {"description": "the same, as a second profile",
                                             "engines": {"solo": {"model": "smollm2-135m"}}}}})
    try:
        c.wait_ready()
        e = start_engine(name="solo", defaults={"n_ctx": 1024, "n_threads": 1},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_serving({"solo": "smollm2-135m"}, timeout=120)
        active = c.http.get("/admin/profile").json()["active"]
        assert active == "one"

        _attack(c.http, _changing_routes(c.http))
        _attack(e.http, _changing_routes(e.http))
        # the issue's own attack: a text/plain POST from another site switched the profile
        r = c.http.post("/admin/profile", content=b'{"name": "two"}',
                        headers={**BROWSER, "Content-Type": "text/plain;charset=UTF-8"})
        assert r.status_code == 403
        assert c.http.get("/admin/profile").json()["active"] == "one"
        r = e.http.post("/control/configure", content=b'{"temperature": 1.5}',
                        headers={**BROWSER, "Content-Type": "text/plain;charset=UTF-8"})
        assert r.status_code == 403
        assert e.http.get("/control/config").json()["params"]["temperature"]["value"] != 1.5

        # the same doors serve scripts, their own origin, and the names they are reached by
        r = e.http.post("/control/configure?wait=1", json={"temperature": 0.5})
        assert r.status_code == 200, r.text
        assert e.http.get("/control/config").json()["params"]["temperature"]["value"] == 0.5
        r = c.http.post("/v1/chat/completions", headers={"Origin": c.url},
                        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = e.http.post("/tokenize", content=b'{"content": "hi"}', headers={"Host": f"localhost:{e.port}"})
        assert r.status_code == 200 and r.json()["tokens"], r.text
        r = c.http.post("/admin/profile", json={"name": "two"}, headers={"Origin": c.url})
        assert r.status_code in (200, 202), r.text
    finally:
        c.stop()


def test_pool_state_is_behind_the_key_and_any_case_of_bearer_opens_it(tmp_path: Path,
                                                                      start_engine: Callable[..., Engine]) -> None:
    from hydrad.common import tokenfile

    key_file = tmp_path / "api.key"
    key = tokenfile.write_token(key_file)
    e = start_engine(extra={"http": {"api_key_file": str(key_file)}})
    e.notify.wait_for("READY=1", 60)
    assert e.http.get("/slots").status_code == 401
    assert e.http.get("/slots", headers={"x-api-key": key}).status_code == 200
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = e.http.post("/tokenize", json={"content": "x"}, headers={"Authorization": f"{scheme} {key}"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_model", (scheme, r.text)  # past the key

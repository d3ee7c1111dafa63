"""The web chat page at ``GET /`` of an engine and of the coordinator's front door, driven in a real headless
Chromium (tests/support/browser.py) through a streamed chat, with an API key on both doors.

Checked at both doors: the page lists the served models from /v1/models; a chat without the key fails with
the door's 401 shown; the key typed into the page is kept in localStorage (still there after a reload) and
sent as a bearer token; the answer streams in several pieces and is the text the API gives for the same
messages; a page of another origin cannot post to the door (the browser's CORS check fails it, and the
door refuses the request a browser would send with 403); the page is served without the key with a
content security policy; ``--no-webui`` (and ``http.webui: false``) leaves ``/`` a 404."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.browser import Chromium, binary
from tests.support.coordinator import Coordinator
from tests.support.engine import SMOLLM, Engine, free_port, models_dir

pytestmark = pytest.mark.model

KEY = "webui-test-key-0123456789"
PROMPT = "Name three colours of the rainbow."


class Pool:
    def __init__(self, tmp: Path) -> None:
        key_file = tmp / "api.key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        profiles = {"profiles": {"one": {"description": "one engine", "engines": {"solo": {"model": "smollm2-135m"}}}},
                    "default": "one"}
        self.coordinator = Coordinator(tmp, profiles=profiles, heartbeat_interval_s=0.5,
                                       extra={"http": {"api_key_file": str(key_file)}})
        self.coordinator.wait_ready()
        self.engine = Engine(tmp, name="solo", defaults={"n_ctx": 1024, "n_parallel": 1, "n_threads": 1,
                                                          "temperature": 0, "n_predict": 24},
                             extra={"http": {"api_key_file": str(key_file)},
                                    "bus": self.coordinator.engine_bus(heartbeat_interval_s=0.5)})
        self.coordinator.wait_serving({"solo": "smollm2-135m"}, timeout=180)
        self.doors = {"engine": self.engine, "coordinator": self.coordinator}

    def stop(self) -> None:
        self.engine.stop()
        self.coordinator.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    binary()  # skip before starting anything when there is no browser
    if not (models_dir() / SMOLLM).is_file():
        pytest.skip(f"model file {SMOLLM} is missing (scripts/setup fetches it)")
    p = Pool(tmp_path_factory.mktemp("webui"))
    yield p
    p.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    b = Chromium(tmp_path)
    yield b
    b.close()


def send(b: Chromium, text: str) -> dict[str, str]:
    """Type ``text`` into the page and send it; the assistant bubble's state once the answer ended."""
    b.eval(f"document.getElementById('prompt').value = {json.dumps(text)}; "
           "document.getElementById('form').requestSubmit(); true")
    b.wait("(() => { const m = document.querySelectorAll('.msg.assistant'); "
           "return m.length && m[m.length - 1].dataset.done; })()", 120, "the answer to end")
    return b.eval("(() => { const m = document.querySelectorAll('.msg.assistant'); const d = m[m.length - 1]; "
                  "return {text: d.textContent, pieces: d.dataset.pieces, done: d.dataset.done, "
                  "status: document.getElementById('status').textContent}; })()")


@pytest.mark.parametrize("door", ["engine", "coordinator"])
def test_a_streamed_chat_in_a_real_browser(door: str, pool: Pool, browser: Chromium) -> None:
    d = pool.doors[door]
    page = httpx.get(d.url + "/")  # served without the key: the page holds no secret
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere

    browser.open(d.url + "/")
    browser.wait("document.getElementById('status').dataset.state", what="the models to load",
                 until=lambda s: s in ("ready", "error"))
    models = browser.eval("[...document.getElementById('model').options].map(o => o.value)")
    assert "smollm2-135m" in models, models

    refused = send(browser, PROMPT)  # no key yet: the door's 401, shown
    assert refused["done"] == "error" and "API key" in refused["status"], refused

    browser.eval(f"const k = document.getElementById('key'); k.value = {json.dumps(KEY)}; "
                 "k.dispatchEvent(new Event('change')); true")
    assert browser.eval("localStorage.getItem('hydra.apiKey')") == KEY
    answer = send(browser, PROMPT)
    assert answer["done"] == "1" and answer["text"], answer
    assert int(answer["pieces"]) > 1, answer  # shown as it arrived, piece by piece

    direct = httpx.post(d.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                        json={"model": "smollm2-135m", "messages": [{"role": "user", "content": PROMPT}]})
    assert direct.status_code == 200, direct.text
    assert direct.json()["choices"][0]["message"]["content"] == answer["text"]

    browser.open(d.url + "/")  # the key is kept in the browser
    assert browser.eval("document.getElementById('key').value") == KEY


def test_another_origin_cannot_post_from_the_browser(pool: Pool, browser: Chromium) -> None:
    engine = pool.engine
    other = f"http://localhost:{engine.port}"  # another origin than http://127.0.0.1:PORT, the same server
    browser.open(other + "/")
    target = engine.url + "/v1/chat/completions"
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    outcome = browser.eval(
        f"fetch({json.dumps(target)}, {{method: 'POST', headers: {{'Content-Type': 'application/json', "
        f"'Authorization': 'Bearer {KEY}'}}, body: {json.dumps(body)}}})"
        ".then(r => 'answered ' + r.status, e => 'refused: ' + e.message)")
    assert outcome.startswith("refused"), outcome
    # what such a page's browser sends without a preflight (a text/plain post) is refused by the door itself
    for ctype in ("text/plain", "application/json"):
        r = httpx.post(target, content=body, headers={"Origin": other, "Content-Type": ctype,
                                                      "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", r.text
    # and the page's own origin is served
    same = browser.eval(
        f"fetch('/v1/chat/completions', {{method: 'POST', headers: {{'Content-Type': 'application/json', "
        f"'Authorization': 'Bearer {KEY}'}}, body: {json.dumps(body)}}}).then(r => r.status)")
    assert same == 200


def test_the_page_can_be_turned_off(tmp_path: Path) -> None:
    if not (models_dir() / SMOLLM).is_file():
        pytest.skip(f"model file {SMOLLM} is missing (scripts/setup fetches it)")
    port = free_port()
    e = Engine(tmp_path, name="quiet", port=port, flags=["-m", str(models_dir() / SMOLLM), "--no-webui", "-c", "512",
                                                          "-np", "1", "-t", "1", "--host", "127.0.0.1",
                                                          "--port", str(port)])
    c = Coordinator(tmp_path, extra={"http": {"webui": False}})
    try:
        e.wait_ready(120)
        c.wait_ready()
        for url in (e.url, c.url):
            r = httpx.get(url + "/")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert e.http.get("/health").status_code == 200
    finally:
        e.stop()
        c.stop()

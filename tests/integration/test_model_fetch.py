"""Model distribution: an engine whose models_dir lacks a registry model fetches it from the coordinator
(GET /models/files/<name>) before loading it: verified, resumable, within its quota, its progress in the
engine's /health, the coordinator's engine records and the console's data.

Real coordinator and engine subprocesses on the real models; the coordinator's transfer rate is capped
(model_files_rate_mib_s) where a test must see a fetch under way."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from hydrad.common import tokenfile
from tests.support.coordinator import Coordinator
from tests.support.engine import GEMMA, SMOLLM, Engine, models_dir
from tests.support.wait import eventually
from tui.format import fmt_load
from tui.model import PoolModel

SMOLLM_SIZE = 98362432
SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROFILES = {"profiles": {"small": {"description": "SmolLM2 on fe", "engines": {"fe": {"model": "smollm2-135m"}}},
                         "big": {"description": "Gemma on fe", "engines": {"fe": {"model": "gemma3-270m"}}}}}


def _pool(tmp: Path, start_engine: Callable[..., Engine], *, source: Path | None = None, rate: float = 0.0,
          profiles: dict[str, Any] | None = None, default: str | None = None,
          fetch: dict[str, Any] | None = None) -> tuple[Coordinator, Engine, Path]:
    """A coordinator serving ``source`` (the real models by default) and engine ``fe`` with an empty models_dir."""
    c = Coordinator(tmp, profiles=profiles, default_profile=default, heartbeat_interval_s=0.5,
                    extra={"models_dir": str(source or models_dir()), "model_files_rate_mib_s": rate,
                           "load_timeout_s": 300})
    _STARTED.append(c)
    c.wait_ready()
    own = tmp / "engine-models"
    own.mkdir(exist_ok=True)
    e = start_engine(name="fe", defaults={"n_ctx": 1024, "n_threads": 1, "n_parallel": 1, "temperature": 0},
                     extra={"models_dir": str(own), "bus": c.engine_bus(heartbeat_interval_s=0.5),
                            **({"fetch": fetch} if fetch else {})})
    c.wait_engines(lambda es: es.get("fe", {}).get("alive") is True, timeout=60, what="fe registered")
    return c, e, own


def _loads(e: Engine) -> list[dict[str, Any]]:
    return [e.http.get(f"/control/loads/{i}").json() for i in range(1, 20)
            if e.http.get(f"/control/loads/{i}").status_code == 200]


_STARTED: list[Coordinator] = []


@pytest.fixture(autouse=True)
def _stop_coordinators() -> Iterator[None]:
    """Each test's coordinator stops with the test, passed or failed (none outlives its test)."""
    yield
    while _STARTED:
        _STARTED.pop().stop()


@pytest.fixture(autouse=True)
def _models(smollm_path: Path) -> None:
    """Every test here needs the default models on disk (the coordinator's copy)."""


def test_an_engine_lacking_smollm_fetches_it_from_the_coordinator_and_serves(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The profile names SmolLM2 for an engine whose disk lacks it: the engine fetches it (progress in the
    coordinator's records and events), checks it, renames it into place, loads it, and the front door's
    request is answered by it."""
    c, e, own = _pool(tmp_path, start_engine, rate=40.0, profiles={**PROFILES, "default": "small"})
    seen: list[str] = []

    def watch(es: dict[str, dict[str, Any]]) -> bool:
        fe = es.get("fe", {})
        if fe.get("fetch"):
            seen.append(fe["fetch"]["text"])
        return fe.get("stage") == "ready" and fe.get("model") == "smollm2-135m"

    c.wait_engines(watch, timeout=120, what="fe serving SmolLM2 after its fetch")
    assert seen and all(t.startswith("fetching ") for t in seen), seen
    assert any("MB/s" in t and "ETA" in t for t in seen), seen
    final = own / SMOLLM
    assert final.stat().st_size == SMOLLM_SIZE
    assert hashlib.sha256(final.read_bytes()).hexdigest() == SMOLLM_SHA
    assert not list(own.glob(".*.hydra-part"))
    assert SMOLLM in json.loads((own / ".hydra-fetched.json").read_text())["files"]
    progress = [ev["data"] for ev in c.events.of("engine.progress") if ev["data"].get("engine") == "fe"]
    assert any(str(p.get("fetch", "")).startswith("fetching") for p in progress), progress
    load = next(ld for ld in _loads(e) if ld["model"] == "smollm2-135m" and ld["phase"] == "done")
    assert load["fetch"]["transferred"] == SMOLLM_SIZE and load["fetch"]["resumed_from"] == 0, load
    r = c.http.post("/v1/chat/completions", json={"model": "smollm2-135m", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-hydra-engine"] == "fe"


def test_an_on_demand_request_for_a_model_no_engine_has_fetches_it_and_is_answered(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """No profile places a model and no engine has SmolLM2 on disk: a request for it is routed to the
    engine that would fetch it (its REGISTER lists it, the coordinator serves the file), which fetches,
    checks and loads it, and the request is answered after the fetch. Before, routing turned it away:
    'neither serves nor has smollm2-135m on disk'."""
    c, e, own = _pool(tmp_path, start_engine)
    fe = c.engines()["fe"]
    assert fe["models_on_disk"] == [] and "smollm2-135m" in fe["models_fetchable"], fe
    r = c.http.post("/v1/chat/completions", timeout=240, json={
        "model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-hydra-engine"] == "fe"
    assert hashlib.sha256((own / SMOLLM).read_bytes()).hexdigest() == SMOLLM_SHA
    load = next(ld for ld in _loads(e) if ld["model"] == "smollm2-135m" and ld["phase"] == "done")
    assert load["fetch"]["transferred"] == SMOLLM_SIZE, load


def test_a_profile_switch_that_needs_a_fetch_shows_it_and_waits_for_it(
        tmp_path: Path, start_engine: Callable[..., Engine], gemma_path: Path) -> None:
    """Switching fe from SmolLM2 (on its disk by hand) to Gemma (not there): the switch waits for the fetch,
    its progress event and the console's engine row say 'fetching N%, X MB/s, ETA', and it ends ok."""
    own = tmp_path / "engine-models"
    own.mkdir()
    shutil.copyfile(models_dir() / SMOLLM, own / SMOLLM)  # the operator's file: never the cache's
    c, e, _ = _pool(tmp_path, start_engine, rate=60.0, profiles={**PROFILES, "default": "small"})
    c.wait_serving({"fe": "smollm2-135m"}, timeout=120)
    r = c.http.post("/admin/profile", json={"name": "big", "wait": False})
    assert r.status_code == 202, r.text
    console = PoolModel()
    shown: list[str] = []

    def fetching() -> bool:
        doc = c.http.get("/admin/engines").json()
        console.apply_engines(doc)
        row = console.engines.get("fe")
        if row is not None and row.fetch:
            shown.append(fmt_load(console, row))
        return (c.http.get("/admin/profile").json().get("last_switch") or {}).get("profile") == "big"

    eventually(fetching, 180, "the switch to big to end", interval=0.1)
    last = c.http.get("/admin/profile").json()["last_switch"]
    assert last["ok"], last
    assert shown and shown[0].startswith("fetching "), shown
    switch_progress = [ev["data"] for ev in c.events.of("profile.progress")]
    assert any(str(p.get("fetch", "")).startswith("fetching") for p in switch_progress), switch_progress
    c.wait_serving({"fe": "gemma3-270m"}, timeout=60)
    assert (own / GEMMA).is_file() and (own / SMOLLM).is_file()
    assert list(json.loads((own / ".hydra-fetched.json").read_text())["files"]) == [GEMMA]


def test_a_corrupted_source_fails_the_load_and_leaves_nothing_under_the_final_name(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The coordinator's copy of SmolLM2 has one byte changed (same size): the engine's check refuses it,
    the load fails naming both digests, and neither the final name nor a partial file is left."""
    bad = tmp_path / "coordinator-models"
    bad.mkdir()
    shutil.copyfile(models_dir() / SMOLLM, bad / SMOLLM)
    with open(bad / SMOLLM, "r+b") as f:
        f.seek(SMOLLM_SIZE // 2)
        byte = f.read(1)
        f.seek(SMOLLM_SIZE // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    c, e, own = _pool(tmp_path, start_engine, source=bad)
    r = e.configure(model="smollm2-135m")
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "SHA-256" in message and SMOLLM_SHA in message, message
    assert not (own / SMOLLM).exists()
    assert not list(own.glob(".*hydra-part"))
    assert e.http.get("/health").json()["stage"] == "idle"


def test_a_fetch_cut_at_half_resumes_from_where_it_stopped(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """The engine is killed (SIGKILL) with about half of SmolLM2 fetched; the next engine on the same
    models_dir asks only for the rest (Range), and the file it loads checks out."""
    c, e, own = _pool(tmp_path, start_engine, rate=24.0)
    part = own / f".{SMOLLM}.hydra-part"
    r = e.configure(wait=False, model="smollm2-135m")
    assert r.status_code == 202, r.text

    def half() -> bool:
        h = e.http.get("/health").json()
        return bool(h.get("fetch")) and h["fetch"]["bytes"] >= SMOLLM_SIZE * 0.45

    eventually(half, 60, "half of the file fetched", interval=0.05, context=e.log)
    e.proc.send_signal(signal.SIGKILL)
    e.proc.wait(10)
    kept = part.stat().st_size
    assert SMOLLM_SIZE * 0.3 < kept < SMOLLM_SIZE, kept
    assert not (own / SMOLLM).exists()
    e.stop()
    e.notify.path.unlink(missing_ok=True)  # the next engine of the same name binds its own
    e2 = start_engine(name="fe", defaults={"n_ctx": 1024, "n_threads": 1, "n_parallel": 1},
                      extra={"models_dir": str(own), "bus": c.engine_bus(heartbeat_interval_s=0.5)})
    c.wait_engines(lambda es: es.get("fe", {}).get("alive") is True and es["fe"]["pid"] == e2.proc.pid,
                   timeout=60, what="the second fe registered")
    r = e2.configure(model="smollm2-135m")
    assert r.status_code == 200, r.text
    fetch = r.json()["load"]["fetch"]
    assert fetch["resumed_from"] >= kept - (1 << 20), fetch  # the bytes the partial file held (less its torn tail)
    assert fetch["transferred"] < SMOLLM_SIZE, fetch
    assert fetch["resumed_from"] + fetch["transferred"] == SMOLLM_SIZE, fetch
    assert hashlib.sha256((own / SMOLLM).read_bytes()).hexdigest() == SMOLLM_SHA
    assert e2.http.get("/health").json()["stage"] == "ready"


def test_the_quota_evicts_the_least_recently_used_fetched_model_never_the_operators(
        tmp_path: Path, start_engine: Callable[..., Engine], gemma_path: Path) -> None:
    """fetch.models_cache_gib holds SmolLM2 or Gemma, not both: with SmolLM2 fetched, used and unloaded,
    loading Gemma deletes it; a file the operator put in models_dir stays, and is not counted."""
    own = tmp_path / "engine-models"
    own.mkdir()
    hand = own / "operator-put.gguf"
    hand.write_bytes(b"GGUF" + bytes(300 << 20))  # 300 MiB of the operator's: larger than the quota
    c, e, _ = _pool(tmp_path, start_engine, fetch={"models_cache_gib": 0.3})
    assert e.configure(model="smollm2-135m").status_code == 200
    assert e.configure(model=None).status_code == 200  # unloaded: no longer in use
    r = e.configure(model="gemma3-270m")
    assert r.status_code == 200, r.text
    assert r.json()["load"]["fetch"]["evicted"] == [SMOLLM]
    assert not (own / SMOLLM).exists() and (own / GEMMA).is_file() and hand.is_file()
    assert list(json.loads((own / ".hydra-fetched.json").read_text())["files"]) == [GEMMA]
    # in use, Gemma is never evicted: SmolLM2 does not fit beside it, and its load fails saying so
    r = e.configure(model="smollm2-135m")
    assert r.status_code == 422 and "models_cache_gib" in r.json()["error"]["message"], r.text
    assert (own / GEMMA).is_file() and e.http.get("/health").json()["model"] == "gemma3-270m"


def test_the_files_door_takes_only_the_pools_token_and_registry_names(tmp_path: Path) -> None:
    """/models/files: no token 401, a wrong one 401, the bus token 206 with the range asked for; a name
    that is not a registry key (a path, a traversal) 404; a coordinator without a bus token serves none."""
    c = Coordinator(tmp_path, extra={"models_dir": str(models_dir()), "http": {"cors_origins": ["http://evil.example"]}})
    c.wait_ready()
    assert c.token_file is not None
    token = tokenfile.read_token(c.token_file)
    url = f"{c.url}/models/files/smollm2-135m"
    with httpx.Client(timeout=30) as h:
        assert h.get(url).status_code == 401
        assert h.get(url, headers={"Authorization": "Bearer " + "x" * 40}).status_code == 401
        r = h.get(url, headers={"Authorization": f"Bearer {token}", "Range": "bytes=4-11"})
        assert r.status_code == 206 and r.headers["content-range"] == f"bytes 4-11/{SMOLLM_SIZE}"
        assert r.content == (models_dir() / SMOLLM).read_bytes()[4:12]
        r = h.get(url, headers={"Authorization": f"Bearer {token}", "Range": f"bytes={SMOLLM_SIZE}-"})
        assert r.status_code == 416
        r = h.head(url, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.headers["content-length"] == str(SMOLLM_SIZE)
        assert r.headers["x-hydra-sha256"] == SMOLLM_SHA
        for name in (SMOLLM, "..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "nope"):
            r = h.get(f"{c.url}/models/files/{name}", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 404, (name, r.status_code)
        # a page on an origin the front door's CORS admits gets no CORS answer for the files
        preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "GET",
                     "Access-Control-Request-Headers": "authorization"}
        assert "access-control-allow-origin" in h.options(f"{c.url}/v1/models", headers=preflight).headers
        assert "access-control-allow-origin" not in h.options(url, headers=preflight).headers
    c.stop()
    (tmp_path / "no-token").mkdir()
    c2 = Coordinator(tmp_path / "no-token", bus_token=False, extra={"models_dir": str(models_dir())})
    c2.wait_ready()
    r = httpx.get(f"{c2.url}/models/files/smollm2-135m", timeout=30)
    assert r.status_code == 403 and "bus_token_file" in r.json()["error"]["message"]
    c2.stop()


def test_a_superseded_load_stops_its_fetch_and_a_stalled_one_fails_in_time(
        tmp_path: Path, start_engine: Callable[..., Engine]) -> None:
    """A configure that supersedes a fetching load (here: unload) stops the transfer: the partial file
    stops growing. A source that goes silent (the coordinator stopped) fails the load after
    fetch.stall_timeout_s, naming the stall, and the next load resumes."""
    c, e, own = _pool(tmp_path, start_engine, rate=16.0, fetch={"stall_timeout_s": 2})
    part = own / f".{SMOLLM}.hydra-part"
    assert e.configure(wait=False, model="smollm2-135m").status_code == 202
    eventually(lambda: part.exists() and part.stat().st_size > 8 << 20, 60, "the fetch under way", interval=0.05)
    assert e.configure(model=None).status_code == 200
    first = next(ld for ld in _loads(e) if ld["model"] == "smollm2-135m")
    assert first["phase"] == "aborted", first
    size = part.stat().st_size
    time.sleep(1.0)
    assert part.stat().st_size == size < SMOLLM_SIZE  # nothing more arrives
    assert e.configure(wait=False, model="smollm2-135m").status_code == 202
    eventually(lambda: part.stat().st_size > size + (4 << 20), 60, "the fetch resumed", interval=0.05)
    c.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        load = eventually(lambda: next((ld for ld in _loads(e) if ld["phase"] == "failed"), None), 30,
                          "the stalled load to fail", interval=0.1)
        assert "stalled" in load["error"] and "fetch.stall_timeout_s" in load["error"], load
        assert time.monotonic() - t0 < 10
    finally:
        c.proc.send_signal(signal.SIGCONT)
    r = e.configure(model="smollm2-135m")
    assert r.status_code == 200, r.text
    assert r.json()["load"]["fetch"]["resumed_from"] > size

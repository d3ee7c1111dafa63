"""Reloads without downtime on a real engine: overlap, drain, failures, supersede, T2 carry, quant swap, SIGHUP."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from tests.support.engine import Engine
from tests.support.wait import eventually

PROMPT = " ".join(f"Item {i} costs {i * 3} coins and weighs {i % 7} stones." for i in range(40))


class Stream:
    """A client sending short requests back to back; records every outcome."""

    def __init__(self, e: Engine) -> None:
        self.e = e
        self.results: list[tuple[float, int, dict[str, Any]]] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(base_url=self.e.url, timeout=60) as c:
            while not self.stop.is_set():
                r = c.post("/v1/completions", json={"prompt": "Say something", "max_tokens": 6, "temperature": 0})
                self.results.append((time.monotonic(), r.status_code, r.json()))

    def __enter__(self) -> "Stream":
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join(60)


def wait_load(e: Engine, load_id: int, timeout: float = 120) -> dict[str, Any]:
    return eventually(lambda: e.http.get(f"/control/loads/{load_id}").json(), timeout, f"load {load_id} to end",
                      until=lambda rec: rec["phase"] in ("done", "failed", "aborted"))


def test_overlap_switch_under_steady_traffic(smollm_path: Path, gemma_path: Path,
                                             start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "reload_policy": "overlap"})
    e.wait_ready()
    seen_reloading = []
    with Stream(e) as s:
        time.sleep(0.5)
        r = e.configure(wait=False, model="gemma3-270m")
        assert r.status_code == 202 and r.json()["policy"] == "overlap", r.text
        while (h := e.http.get("/health")).json()["stage"] == "reloading":
            seen_reloading.append(h.status_code)
        rec = wait_load(e, r.json()["load_id"])
        assert rec["phase"] == "done", rec
        assert rec["threads_lent"] == 1, rec  # load_threads' default: the old generation served beside the load
        parts = [rec["timings"][k] for k in ("model_s", "context_s", "warmup_s")]  # load_s, part by part
        assert all(p > 0 for p in parts) and sum(parts) <= rec["timings"]["load_s"] + 1e-3, rec
        # on a loaded machine the next responses can take a while
        eventually(lambda: any(b.get("model") == "gemma3-270m" for _, _, b in s.results), 60,
                   "a response from gemma3-270m", interval=0.1)
    codes = [code for _, code, _ in s.results]
    assert codes and all(c == 200 for c in codes), codes
    models = [body["model"] for _, _, body in s.results]
    assert models[0] == "smollm2-135m" and models[-1] == "gemma3-270m", (models, rec)
    assert all(body["choices"][0]["finish_reason"] in ("stop", "length") for _, _, body in s.results)
    assert len({body["system_fingerprint"] for _, _, body in s.results}) == 2
    # still serving while reloading: the stage is "reloading" from the 202 on, so /health was polled
    # in it at least once (an empty list proved nothing), and it answered 200 every time
    assert seen_reloading and all(code == 200 for code in seen_reloading), seen_reloading
    # the old generation is freed on the reaper's thread once its last request ended, not on the engine's
    retired = eventually(lambda: [ln for ln in e.log_path.read_text().splitlines() if "generation retired" in ln],
                         30, "the old generation to be freed")
    assert len(retired) == 1 and "free_ms=" in retired[0] and "why=" in retired[0], retired
    assert "parts=context:" in retired[0] and ",model:" in retired[0], retired


def test_a_load_frees_what_the_reaper_still_holds_first(smollm_path: Path, gemma_path: Path,
                                                         start_engine: Callable[..., Engine]) -> None:
    """The reaper holds a retired generation for ``reaper.delay_ms``; a load that comes sooner has it
    freed before it allocates, and the freed generation's log line says how long it was held."""
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "reload_policy": "overlap"},
                     # cuda_pinned_host: alone arms the engine's pageable-buffer gate at start (no CUDA here, so the
                     # window it opens over the new context changes nothing but must not get in the load's way)
                     extra={"reaper": {"delay_ms": 60_000, "pause_ms": 60_000}, "load_threads": 2,
                            "cuda_pinned_host": "alone"})
    e.wait_ready()
    r = e.configure(model="gemma3-270m")
    assert r.status_code == 200 and r.json()["load"]["threads_lent"] == 2, r.text  # the setting reached the engine
    time.sleep(0.3)
    assert not [ln for ln in e.log_path.read_text().splitlines() if "generation retired" in ln]  # held
    t0 = time.monotonic()
    assert e.configure(model="smollm2-135m").status_code == 200
    assert time.monotonic() - t0 < 30  # neither the delay nor the pause was waited for
    lines = e.log_path.read_text().splitlines()
    retired = [i for i, ln in enumerate(lines) if "generation retired" in ln]
    loading = [i for i, ln in enumerate(lines) if "loading model" in ln and "load=3" in ln]
    assert retired and loading and retired[0] < loading[0], lines[-20:]
    held = float(lines[retired[0]].split("held_ms=")[1].split()[0])
    assert held < 30_000, lines[retired[0]]
    assert e.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}).status_code == 200


@pytest.mark.serial  # the drain and the queued requests' waits are bounded in wall-clock time
def test_drain_serves_queued_requests_after_the_load(smollm_path: Path, gemma_path: Path,
                                                      start_engine: Callable[..., Engine]) -> None:
    # the drain bound well above the 120-token answer's time, even on a loaded 2-core machine: this test is
    # about what drains and what waits, not about the bound itself
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0, "reload_policy": "drain",
                               "reload_queue_timeout_s": 120}, extra={"drain_timeout_s": 120})
    e.wait_ready()
    out: dict[str, Any] = {}

    def inflight() -> None:
        out["inflight"] = httpx.post(e.url + "/v1/completions", timeout=120, json={
            "prompt": "Count:", "max_tokens": 120, "ignore_eos": True})

    t = threading.Thread(target=inflight)
    t.start()
    eventually(lambda: e.http.get("/slots").json(), 30, "a slot to be processing",
               until=lambda slots: any(sl["is_processing"] for sl in slots), interval=0.01)
    r = e.configure(wait=False, model="gemma3-270m")
    assert r.json()["policy"] == "drain", r.text
    queued = httpx.post(e.url + "/v1/completions", timeout=120, json={"prompt": "Hello", "max_tokens": 4})
    t.join(120)
    assert out["inflight"].status_code == 200, out["inflight"].text
    assert out["inflight"].json()["usage"]["completion_tokens"] == 120
    assert out["inflight"].json()["model"] == "smollm2-135m"
    assert queued.status_code == 200 and queued.json()["model"] == "gemma3-270m"
    rec = wait_load(e, r.json()["load_id"])
    assert rec["phase"] == "done" and rec["timings"]["drain_s"] > 0
    assert rec["threads_lent"] == 0, rec  # nothing served beside a drained load


def test_drain_queue_bound_answers_503_with_retry_after(smollm_path: Path, gemma_path: Path,
                                                        start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "reload_policy": "drain", "reload_queue_timeout_s": 0.2},
                     extra={"drain_timeout_s": 20})
    e.wait_ready()
    t = threading.Thread(target=lambda: httpx.post(e.url + "/v1/completions", timeout=120, json={
        "prompt": "Count:", "max_tokens": 150, "ignore_eos": True}))
    t.start()
    eventually(lambda: e.http.get("/slots").json(), 30, "a slot to be processing",
               until=lambda slots: any(sl["is_processing"] for sl in slots), interval=0.01)
    e.configure(wait=False, model="gemma3-270m")
    r = httpx.post(e.url + "/v1/completions", timeout=60, json={"prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 503 and r.headers.get("Retry-After") and r.json()["error"]["code"] == "reloading"
    t.join(120)


def test_bad_path_and_truncated_gguf_keep_old_model(smollm_engine: Engine, tmp_path: Path) -> None:
    e = smollm_engine
    r = e.configure(model=str(tmp_path / "missing.gguf"))
    assert r.status_code == 404
    bad = tmp_path / "half.gguf"
    bad.write_bytes(Path(e.http.get("/v1/models").json()["data"][0]["meta"]["path"]).read_bytes()[:5_000_000])
    r = e.configure(model=str(bad))
    assert r.status_code == 422 and "failed" in r.json()["error"]["message"]
    h = e.http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "smollm2-135m" and "half.gguf" in h["last_error"]
    assert e.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}).status_code == 200
    assert e.http.get("/control/config").json()["params"]["model"]["value"] == "smollm2-135m"


def test_configure_during_reload_supersedes_it(smollm_path: Path, gemma_path: Path,
                                               start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0})
    e.wait_ready()
    first = e.configure(wait=False, model="gemma3-270m").json()
    second = e.configure(wait=False, n_ctx=2048)
    assert second.status_code == 202, second.text
    rec2 = wait_load(e, second.json()["load_id"])
    rec1 = e.http.get(f"/control/loads/{first['load_id']}").json()
    assert rec1["phase"] in ("aborted", "done") and rec2["phase"] == "done"
    cfg = e.http.get("/control/config").json()["params"]
    assert cfg["model"]["value"] == "gemma3-270m" and cfg["n_ctx"]["value"] == 2048
    assert e.http.get("/v1/models").json()["data"][0]["meta"]["n_ctx"] == 2048


def test_t2_change_carries_slot_kv(smollm_engine: Engine) -> None:
    e = smollm_engine
    first = e.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 1}).json()
    n = first["usage"]["prompt_tokens"]
    r = e.configure(n_ctx=6144)
    assert r.json()["tier"] == "T2" and r.json()["carried"] == 1, r.text
    again = e.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 1}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    r = e.configure(n_ctx=256)  # too small for the slot: dropped, with the count reported
    assert r.json()["dropped"] == 1 and r.json()["carried"] == 0


def test_swap_quant_keeps_sessions(smollm_q8: Path, gemma_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0})
    e.wait_ready()
    first = e.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "id_slot": 0}).json()
    n = first["usage"]["prompt_tokens"]
    r = e.http.post("/control/swap_quant?wait=1", json={"model": str(smollm_q8)})
    assert r.status_code == 200, r.text
    assert r.json()["load"]["carried"] == {"carried": 1, "dropped": 0}
    cont = e.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 16, "id_slot": 0}).json()
    assert cont["model"] == smollm_q8.stem
    assert cont["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1 and cont["timings"]["prompt_n"] == 1
    words = cont["choices"][0]["text"].split()
    assert len(words) >= 3 and sum(w.isascii() for w in words) >= len(words) - 1
    bad = e.http.post("/control/swap_quant?wait=1", json={"model": "gemma3-270m"})
    assert bad.status_code in (400, 422) and "sibling" in bad.json()["error"]["message"]
    assert e.http.get("/health").json()["model"] == smollm_q8.stem


def test_sighup_reloads_yaml_with_reloading_notify(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m"})
    e.wait_ready()
    cfg = yaml.safe_load(e.config.read_text())
    cfg["defaults"]["n_ctx"] = 3072
    e.config.write_text(yaml.safe_dump(cfg))
    n_ready = e.notify.lines().count("READY=1")
    e.proc.send_signal(signal.SIGHUP)
    e.notify.wait_count("READY=1", above=n_ready)
    msgs = [m for _, m in e.notify.messages]
    reloading = [m for m in msgs if "RELOADING=1" in m.splitlines()]
    assert reloading and any(line.startswith("MONOTONIC_USEC=") for line in reloading[0].splitlines())
    assert any("READY=1" in m.splitlines() for m in msgs[msgs.index(reloading[0]) + 1:])
    assert e.http.get("/v1/models").json()["data"][0]["meta"]["n_ctx"] == 3072
    assert e.http.get("/control/config").json()["params"]["n_ctx"]["source"] == "yaml"


def test_failed_drain_load_restores_the_previous_model(smollm_engine: Engine, tmp_path: Path) -> None:
    e = smollm_engine
    bad = tmp_path / "half.gguf"
    bad.write_bytes(Path(e.http.get("/v1/models").json()["data"][0]["meta"]["path"]).read_bytes()[:5_000_000])
    assert e.configure(reload_policy="drain").json()["tier"] == "T1"
    r = e.configure(model=str(bad))
    assert r.status_code == 422
    rec = e.http.get("/control/loads/2").json()
    assert rec["policy"] == "drain" and rec["phase"] == "failed" and rec["timings"].get("restored_previous") == 1.0
    h = e.http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "smollm2-135m" and "half.gguf" in h["last_error"]
    assert e.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}).status_code == 200


def test_sighup_load_superseded_by_a_configure_still_ends_with_ready(gemma_path: Path, smollm_path: Path,
                                                                     start_engine: Callable[..., Engine]) -> None:
    """A SIGHUP load that a configure aborts is over: systemd hears READY=1 again (the handler
    used to wait for 'done' or 'failed' only, and spun for ever on 'aborted')."""
    e = start_engine(defaults={"model": "smollm2-135m"})
    e.wait_ready()
    cfg = yaml.safe_load(e.config.read_text())
    cfg["defaults"]["model"] = "gemma3-270m"
    e.config.write_text(yaml.safe_dump(cfg))
    n_ready = e.notify.lines().count("READY=1")
    e.proc.send_signal(signal.SIGHUP)
    eventually(lambda: e.http.get("/health").json().get("load_id"), 30, "the SIGHUP load to start",
               until=lambda load: load is not None, interval=0.005)
    r = e.configure(model="smollm2-135m")
    assert r.status_code in (200, 202), r.text
    e.notify.wait_count("READY=1", above=n_ready)
    after_hup = e.notify.lines()[e.notify.lines().index("RELOADING=1"):]
    assert any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in after_hup)  # the reload job waits on us
    loads = [e.http.get(f"/control/loads/{i}").json() for i in (2,)]
    assert loads[0]["phase"] in ("aborted", "done"), loads
    assert e.http.get("/health").json()["model"] == "smollm2-135m"


def _load_of(e: Engine, timeout: float = 30.0) -> int:
    load = eventually(lambda: e.http.get("/health").json().get("load_id"), timeout, "a load to start",
                      until=lambda load: load is not None, interval=0.005,
                      ignore=(httpx.TransportError,))  # not listening yet
    return int(load)


def test_configure_for_the_model_being_loaded_joins_the_boot_load(gemma_path: Path,
                                                                  start_engine: Callable[..., Engine]) -> None:
    """A coordinator asking for the model the YAML is already loading must not abort that load
    (the engine used to end idle with no model for good)."""
    e = start_engine(defaults={"model": "gemma3-270m"})
    boot = _load_of(e)
    r = e.configure(wait=False, model="gemma3-270m")
    assert r.status_code in (200, 202), r.text
    body = r.json()
    if body.get("load_id") is not None:  # the boot load was still running: joined, not restarted
        assert body["load_id"] == boot and body.get("joined") is True, body
    assert e.wait_ready()["model"] == "gemma3-270m"
    assert e.http.get(f"/control/loads/{boot}").json()["phase"] == "done"


def test_configure_superseding_the_boot_load_still_loads_the_merged_target(gemma_path: Path,
                                                                           start_engine: Callable[..., Engine]) -> None:
    """A configure that changes something else while the YAML's model loads aborts that load and
    loads the merged target: the YAML's model with the new setting, not nothing."""
    e = start_engine(defaults={"model": "gemma3-270m"})
    boot = _load_of(e)
    r = e.configure(wait=False, n_ctx=3072)
    assert r.status_code in (200, 202), r.text
    h = e.wait_ready()
    assert h["model"] == "gemma3-270m"
    assert e.http.get("/v1/models").json()["data"][0]["meta"]["n_ctx"] == 3072
    assert e.http.get(f"/control/loads/{boot}").json()["phase"] in ("aborted", "done")


def test_sighup_change_shadowed_by_a_runtime_setting_is_a_warning(smollm_path: Path,
                                                                   start_engine: Callable[..., Engine]) -> None:
    """Under a coordinator the profile's configure sets the model at the runtime layer, which wins
    over the YAML: a re-read that changes the YAML's model does nothing, and says so."""
    e = start_engine(defaults={"model": "smollm2-135m"})
    e.wait_ready()
    assert e.configure(n_ctx=3072).status_code == 200
    cfg = yaml.safe_load(e.config.read_text())
    cfg["defaults"]["n_ctx"] = 2048
    e.config.write_text(yaml.safe_dump(cfg))
    n_ready = e.notify.lines().count("READY=1")
    e.proc.send_signal(signal.SIGHUP)
    e.notify.wait_count("READY=1", above=n_ready)
    warning = [line for line in e.log().splitlines() if "YAML change has no effect" in line]
    assert warning and "level=warning" in warning[0] and "fields=n_ctx" in warning[0], e.log()[-2000:]
    assert e.http.get("/v1/models").json()["data"][0]["meta"]["n_ctx"] == 3072


def test_a_new_generations_warm_up_leaves_nothing_behind(smollm_engine: Engine, gemma_path: Path) -> None:
    """The warm-up (a short throw-away prompt and one decode step on each new generation) must leave no
    KV behind: the first answer after a reload is the same as the second, and every slot is empty. The
    load record says how long the warm-up took, as part of the load."""
    e = smollm_engine
    r = e.http.post("/control/configure?wait=1", json={"model": str(gemma_path)}, timeout=180)
    assert r.status_code == 200, r.text
    timings = r.json()["load"]["timings"]
    assert 0 < timings["warmup_s"] < timings["load_s"], timings
    eventually(lambda: e.http.get("/health").json(), 120, "gemma loaded",
               until=lambda h: h["status"] == "ok" and h["model"] != "smollm2-135m")
    assert all(row["n_tokens"] == 0 for row in e.http.get("/slots").json())
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "cache_prompt": False}
    first = e.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    second = e.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert first == second and first


def test_an_engine_asked_to_watch_its_event_loop_runs_the_watch_and_serves(start_engine: Callable[..., Engine]) -> None:
    """``logging.slow_loop_ms`` starts the loop watch (its own OS thread, named) beside the serving engine;
    tests/unit/common/test_loopwatch.py holds a real loop and reads what the watch logs."""
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0}, extra={"logging": {"slow_loop_ms": 50}})
    e.wait_ready()
    names = eventually(lambda: [n for n in (p.read_text().strip() for p in Path(f"/proc/{e.proc.pid}/task").glob("*/comm"))
                                if n == "hydrad-looplag"], 10, "the loop watch's thread")
    assert names == ["hydrad-looplag"]
    r = e.http.post("/v1/completions", json={"prompt": "Say something", "max_tokens": 3})
    assert r.status_code == 200, r.text


def test_slow_turns_are_logged_with_where_their_time_went(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "temperature": 0},
                     extra={"logging": {"slow_turn_ms": 0.001}})  # every busy turn is "slow"
    e.wait_ready()
    r = e.http.post("/v1/completions", json={"prompt": "Say something", "max_tokens": 3})
    assert r.status_code == 200, r.text
    fp = r.json()["system_fingerprint"]
    lines = eventually(lambda: [ln for ln in e.log_path.read_text().splitlines() if "slow engine turn" in ln],
                       10, "slow turns in the log")
    stepped = [ln for ln in lines if f"steps={fp}:" in ln]
    assert stepped and all(k in stepped[0] for k in ("ms=", "commands_ms=", "admit_ms=", "after_ms=")), lines

"""hydrad as a real process: real llama.cpp, real models, real sockets, a test-bound NOTIFY_SOCKET."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx
import openai
import pytest

from tests.support.engine import Engine, metric, steps_of_bursts
from tests.support.wait import eventually

CHAT = [{"role": "user", "content": "Write a long story about a cat who learns to sail."}]


def client(e: Engine) -> openai.OpenAI:
    return openai.OpenAI(base_url=e.url + "/v1", api_key="unused", max_retries=0, timeout=120)


# ---- boot, readiness, loading --------------------------------------------------------------

def test_model_less_boot_is_ready_within_one_second(start_engine: Callable[..., Engine]) -> None:
    """READY=1 within a second of the process starting. Judged on the median of three boots, one after
    another: on a shared 2-core machine a single boot (0.6 s when quiet) now and then took 1.03 s
    while other work held the cores, and a slower boot code path shows in every one of them. It relies on the
    package's bytecode being written (scripts/setup does it): compiling every module from source at each
    start, where PYTHONDONTWRITEBYTECODE is set, costs about 0.3 s more."""
    boots = []
    for i in range(3):
        e = start_engine(name=f"boot{i}")
        boots.append(e.notify.wait_for("READY=1", timeout=10) - e.started)
        if i < 2:
            e.stop()
    assert sorted(boots)[1] <= 1.0, f"READY=1 after {', '.join(f'{b:.3f}' for b in boots)} s"
    r = e.http.get("/health")
    assert r.status_code == 503 and r.json()["stage"] == "idle"
    assert e.http.get("/livez").status_code == 200
    assert any(line.startswith("STATUS=idle") for line in e.notify.lines())
    # a model-less engine refuses generation clearly instead of hanging
    r = e.http.post("/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_model"


def test_load_reports_rising_progress_then_ready(gemma_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine()
    e.notify.wait_for("READY=1")
    r = e.configure(wait=False, model="gemma3-270m")
    assert r.status_code == 202 and r.json()["tier"] == "T3", r.text
    seen: list[tuple[int, dict[str, Any]]] = []
    def health() -> tuple[int, dict[str, Any]]:
        h = e.http.get("/health")
        seen.append((h.status_code, h.json()))
        return seen[-1]

    eventually(health, 60, "gemma3-270m to serve (/health 200)", until=lambda h: h[0] == 200, interval=0)
    loading = [b for code, b in seen if code == 503 and b["stage"] in ("loading_model", "warming")]
    assert loading, f"never saw a loading stage: {seen[:3]}"
    assert all(b["status"] == "loading" and "progress" in b for b in loading)
    progress = [b["progress"] for b in loading]
    assert progress == sorted(progress), progress
    assert seen[-1][0] == 200 and seen[-1][1]["model"] == "gemma3-270m"
    e.notify.wait_prefix("STATUS=ready")
    lines = e.notify.lines()
    assert any(line.startswith("STATUS=loading_model") for line in lines), lines
    # READY=1 came before the load: a load is runtime work and must not push systemd's deadlines
    # (systemd 252 moves the watchdog's too, which hid hangs after a load for 30 s)
    assert not any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in lines), lines
    rec = e.http.get(f"/control/loads/{r.json()['load_id']}").json()
    assert rec["phase"] == "done" and rec["seconds"] > 0


def test_failed_load_keeps_serving_and_reports(smollm_engine: Engine, tmp_path: Path) -> None:
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    r = smollm_engine.configure(model=str(bad))
    assert r.status_code == 422 and "load failed" in r.json()["error"]["message"]
    h = smollm_engine.http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "smollm2-135m" and "truncated.gguf" in h["last_error"]
    out = client(smollm_engine).completions.create(model="smollm2-135m", prompt="Hello", max_tokens=4)
    assert out.choices[0].text


# ---- OpenAI API ---------------------------------------------------------------------------

def test_chat_completion_and_stream_with_openai_client(smollm_engine: Engine) -> None:
    c = client(smollm_engine)
    out = c.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=16, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 16
    assert out.usage.prompt_tokens > 5 and out.system_fingerprint.startswith("hydra-g")
    parts, finish, usage = [], None, None
    for ch in c.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=16, temperature=0,
                                        stream=True, stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts) == out.choices[0].message.content  # greedy: stream == non-stream
    assert finish == "length" and usage is not None and usage.completion_tokens == 16


def test_completions_stop_and_seed(smollm_engine: Engine) -> None:
    c = client(smollm_engine)
    full = c.completions.create(model="smollm2-135m", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0]
    assert "5" in full.text
    cut = c.completions.create(model="smollm2-135m", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["7"])
    assert cut.choices[0].finish_reason == "stop" and "7" not in cut.choices[0].text
    assert full.text.startswith(cut.choices[0].text)
    a = c.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=42).choices[0].text
    b = c.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=42).choices[0].text
    assert a == b
    exact = c.completions.create(model="smollm2-135m", prompt="Hi", max_tokens=40, extra_body={"ignore_eos": True})
    assert exact.usage.completion_tokens == 40 and exact.choices[0].finish_reason == "length"


def test_errors_are_openai_json(smollm_engine: Engine) -> None:
    c = client(smollm_engine)
    # another model's name is served by the loaded model, as llama-server serves it (strict: test_model_names.py)
    other = c.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4)
    assert other.model == "smollm2-135m" and other.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as br:  # more choices than the engine's slots
        c.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=4, n=16)
    assert br.value.body["param"] == "n"
    r = smollm_engine.http.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = smollm_engine.http.post("/v1/completions", json={"prompt": "x " * 5000, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["type"] == "exceed_context_size_error" and r.json()["error"]["n_prompt_tokens"] > 0
    r = smollm_engine.http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    models = c.models.list().data
    assert [m.id for m in models] == ["smollm2-135m"]


# ---- batching and cache -------------------------------------------------------------------

def test_four_concurrent_streams_complete_together_in_shared_steps(smollm_engine: Engine) -> None:
    """Four streams at once all complete, overlap in time, and share decode steps. How much faster
    that is than one after another is a speed claim: scripts/bench_engine.py measures it."""
    c = client(smollm_engine)

    def one(i: int) -> tuple[float, float, int]:
        n = 0
        t0 = time.monotonic()
        for ch in c.completions.create(model="smollm2-135m", prompt=f"Story number {i}: once upon a time", max_tokens=64,
                                       temperature=0, stream=True):
            n += sum(1 for choice in ch.choices if choice.text)
        return t0, time.monotonic(), n

    one(99)  # warm
    decode_before = metric(smollm_engine, "llamacpp:n_decode_total")
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(one, range(4)))
    steps = metric(smollm_engine, "llamacpp:n_decode_total") - decode_before
    assert all(n > 0 for _, _, n in runs), runs
    assert max(start for start, _, _ in runs) < min(end for _, end, _ in runs), runs  # all four in flight at once
    # one llama_decode per step for all streams: far fewer steps than tokens generated
    assert steps < 0.6 * 4 * 64, steps


def test_a_burst_of_prompts_is_prefilled_one_ubatch_per_step(smollm_path: Path,
                                                            start_engine: Callable[..., Engine]) -> None:
    """prefill_split ubatch: while several prompts wait, a step takes at most n_ubatch tokens, so four
    prompts of 48 tokens (192 in all) at n_ubatch 64 need at least three prefill steps however they
    arrive, where n_batch (512) would take them in one; every answer still completes."""
    e = start_engine(name="ubatch", defaults={"model": "smollm2-135m", "temperature": 0, "n_ubatch": 64,
                                              "n_batch": 512, "n_parallel": 4, "n_threads": 1})
    e.wait_ready()
    assert e.http.get("/control/config").json()["params"]["prefill_split"]["value"] == "ubatch"
    prompts = [{"prompt": [1 + (i * 48 + k) % 4000 for k in range(48)], "n_predict": 1, "temperature": 0,
                "cache_prompt": False} for i in range(4)]
    decode_before = metric(e, "llamacpp:n_decode_total")
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: e.http.post("/completion", json=b), prompts))
    steps = metric(e, "llamacpp:n_decode_total") - decode_before
    assert all(r.status_code == 200 and r.json()["tokens_predicted"] == 1 for r in answers), [r.text for r in answers]
    assert all(r.json()["tokens_evaluated"] == 48 for r in answers)
    assert steps >= 3, steps


def test_a_burst_arriving_at_an_idle_engine_starts_in_one_step(smollm_path: Path,
                                                               start_engine: Callable[..., Engine]) -> None:
    """Requests that reach an idle engine together are admitted together: the event loop parses one
    request at a time, and the ones submitted in one pass of the loop go to the engine thread at once,
    so four short prompts arriving together are prefilled in one llama_decode, not the first alone and
    the others a step later. (Each request is written to its own connection but its last byte, then the
four last bytes back to back, as a burst arrives.)"""
    e = start_engine(name="burst", defaults={"model": "smollm2-135m", "temperature": 0, "n_parallel": 4,
                                             "n_threads": 1, "prefill_split": "batch"})
    e.wait_ready()
    bodies = [json.dumps({"prompt": [1 + 7 * i + k for k in range(8)], "n_predict": 1, "cache_prompt": False}).encode()
              for i in range(4)]
    steps = steps_of_bursts(e, e.url, "/completion", bodies)
    assert min(steps) == 1, steps


def test_follow_up_turn_reports_cached_tokens(smollm_engine: Engine) -> None:
    c = client(smollm_engine)
    first = c.chat.completions.create(messages=CHAT, model="smollm2-135m", max_tokens=24, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    follow = CHAT + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Now make it shorter."}]
    second = c.chat.completions.create(messages=follow, model="smollm2-135m", max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1, (cached, first.usage.prompt_tokens)
    assert cached < second.usage.prompt_tokens


def _stream_text(e: Engine, body: dict[str, Any]) -> tuple[str, str | None, int]:
    parts, finish, used = [], None, -1
    with e.http.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ev = json.loads(line[6:])
                for ch in ev.get("choices") or []:
                    parts.append(ch.get("text") or "")
                    finish = ch.get("finish_reason") or finish
                if ev.get("usage"):
                    used = ev["usage"]["completion_tokens"]
    return "".join(parts), finish, used


def test_text_overlap_changes_no_output(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    """With text_overlap on (the GPU default; forced here on a CPU), text is made while the next
    step decodes, so a stop string is seen one step late: the answers must not change at all.
    Two fresh engines take the same requests in the same order, so their KV cells (which decide
    the float reduction order) match too."""
    bodies = [{"prompt": "1, 2, 3, 4,", "max_tokens": 24, "temperature": 0, "stop": stop}
              for stop in (["7"], [", 9"], ["1"], ["zzz"], [" 5", "6"])]
    bodies.append({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "ignore_eos": True})
    # a prompt longer than n_batch (256 here): its first step holds prompt rows only, which "on" does not wait for
    bodies.append({"prompt": " ".join(f"alpha{i}" for i in range(150)), "max_tokens": 6, "temperature": 0})

    def answers(mode: str) -> list[Any]:
        e = start_engine(name=f"overlap-{mode}", defaults={"model": "smollm2-135m", "temperature": 0,
                                                           "text_overlap": mode, "n_batch": 256, "n_ubatch": 256})
        e.wait_ready()
        assert e.http.get("/control/config").json()["params"]["text_overlap"]["value"] == mode
        out = []
        for b in bodies:
            r = e.http.post("/v1/completions", json=b).json()
            out.append((r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]))
            out.append(_stream_text(e, b))
        with ThreadPoolExecutor(len(bodies)) as pool:  # together, so stops land in shared steps
            out += list(pool.map(lambda ib: _stream_text(e, {**ib[1], "id_slot": ib[0]}), enumerate(bodies)))
        unwaited = metric(e, "hydra_steps_unwaited_total")
        assert (unwaited > 0) == (mode == "on"), unwaited
        e.stop()
        return out

    off, on = answers("off"), answers("on")
    assert on == off
    assert off[0][1] == "stop" and "7" not in off[0][0] and off[11][1] == "length" and off[11][2] == 20
    assert off[12][1] == "length" and off[12][2] == 6, off[12]  # the long prompt was answered, not refused


# ---- configure tiers ------------------------------------------------------------------------

def test_configure_tiers(smollm_engine: Engine) -> None:
    e = smollm_engine
    r = e.configure(http={"port": 1}, n_ctx=2048)
    assert r.status_code == 400 and "http" in r.json()["error"]["message"]
    r = e.configure(model="does-not-exist")
    assert r.status_code == 404 and "does-not-exist" in r.json()["error"]["message"]
    assert e.http.get("/health").json()["status"] == "ok"
    r = e.configure(bogus=1)
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]
    r = e.configure(temperature=0.2)
    assert r.json()["tier"] == "T1"
    r = e.configure(temperature=0.2)
    assert r.json() == {"tier": "none", "action": "none", "changed": []}
    loads = metric(e, "hydra_model_loads_total")
    r = e.configure(n_ctx=2048)
    assert r.status_code == 200 and r.json()["tier"] == "T2" and r.json()["changed"] == ["n_ctx"], r.text
    assert metric(e, "hydra_model_loads_total") == loads  # the model was not reloaded
    assert metric(e, "hydra_context_rebuilds_total") == 1
    assert e.http.get("/v1/models").json()["data"][0]["meta"]["n_ctx"] == 2048
    cfg = e.http.get("/control/config").json()["params"]
    assert cfg["n_ctx"] == {"value": 2048, "source": "runtime", "tier": "T2"}
    assert cfg["model"]["source"] == "yaml"
    out = client(e).completions.create(model="smollm2-135m", prompt="Hello", max_tokens=4)
    assert out.usage.completion_tokens > 0


def test_bad_yaml_exits_non_zero_naming_file_and_field(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhttp:\n  port: eighty\n")
    r = subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", "--config", str(bad)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and str(bad) in r.stderr and "http.port" in r.stderr


# ---- systemd lifecycle ----------------------------------------------------------------------

@pytest.mark.serial  # the stream must finish within the drain's wall-clock bound
def test_sigterm_during_stream_drains_and_exits_zero(smollm_engine: Engine) -> None:
    e = smollm_engine
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", e.url + "/v1/completions", timeout=60,
                          json={"prompt": "Tell me a story", "max_tokens": 200, "stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    events.append(line)
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    e.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert e.proc.wait(30) == 0
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] in ("length", "stop")  # the in-flight stream finished its work
    assert "STOPPING=1" in e.notify.lines()


def test_sigterm_past_drain_bound_ends_stream_with_error(smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "n_ctx": 8192}, extra={"drain_timeout_s": 0.5})
    e.wait_ready()
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", e.url + "/v1/completions", timeout=60,
                          json={"prompt": "Tell me a story", "max_tokens": 6000, "stream": True,
                                "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line:
                    events.append(line)
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    e.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert not t.is_alive()
    assert e.proc.wait(30) == 0
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: "):])
    assert err["error"]["code"] == "shutting_down"


def test_the_engine_says_how_many_cpus_its_pools_default_to(start_engine: Callable[..., Engine]) -> None:
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed: no way to start the engine under a narrower mask")
    mine = sorted(os.sched_getaffinity(0))
    e = start_engine(wrap=("taskset", "-c", str(mine[0])))
    e.notify.wait_for("READY=1")
    line = next(ln for ln in e.log().splitlines() if "listening" in ln)
    assert " cpus=1 " in f"{line} " and " affinity_cpus=1 " in f"{line} ", line


def test_watchdog_pings_while_engine_alive(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(env={"WATCHDOG_USEC": "400000"})
    e.notify.wait_for("READY=1")
    time.sleep(1.2)
    assert e.notify.lines().count("WATCHDOG=1") >= 3


def test_journald_priority_prefixes(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(env={"JOURNAL_STREAM": "auto"})
    e.notify.wait_for("READY=1")
    e.stop()
    lines = [line for line in e.log().splitlines() if line.strip()]
    assert lines and all(line.startswith("<") for line in lines[:3]), lines[:3]
    assert any(line.startswith("<6>") and "listening" in line for line in lines)


def test_metrics_exposition(smollm_engine: Engine) -> None:
    client(smollm_engine).completions.create(model="smollm2-135m", prompt="Hi", max_tokens=3)
    text = smollm_engine.http.get("/metrics").text
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred", "hydra_slots_busy",
                 "hydra_model_load_seconds", 'hydra_stage{engine="test",stage="ready"} 1'):
        assert name in text, name
    assert metric(smollm_engine, "llamacpp:tokens_predicted_total") >= 3


def test_device_binding_is_reported(start_engine: Callable[..., Engine]) -> None:
    """``device`` (start-only) is what the engine says it is bound to; no GPU here to see more."""
    e = start_engine(extra={"device": "0"})
    e.notify.wait_for("READY=1")
    assert e.http.get("/health").json()["device"] == "0"

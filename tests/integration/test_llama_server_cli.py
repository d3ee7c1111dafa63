"""hydrad started with llama-server's command line, as a real process on the real model: the engine
those flags describe (its model named by --alias, its context and slots as -c and -np say), answering
any model name as llama-server does; a config file given too wins where both set a field, and keeps
winning across a SIGHUP re-read; a flag hydrad cannot honour ends the start with one line naming it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.support.engine import REPO, Engine, free_port

KEY = "cli-test-key-0123456789"


def hydrad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def chat(e: Engine, model: str | None, **kw: Any) -> Any:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                            "max_tokens": 8, "temperature": 0, **kw}
    if model is not None:
        body["model"] = model
    return e.http.post("/v1/chat/completions", json=body)


@pytest.mark.model
def test_a_llama_server_command_line_starts_that_engine(smollm_path: Path,
                                                        start_engine: Callable[..., Engine]) -> None:
    port = free_port()
    e = start_engine(name="cli", port=port, flags=[
        "-m", str(smollm_path), "--port", str(port), "-c", "2048", "-np", "2", "--jinja", "--alias", "my-model",
        "-t", "1", "--embeddings", "--pooling", "mean", "--metrics", "-cb"])
    e.wait_ready(120)

    r = chat(e, "my-model")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == "my-model" and answer["choices"][0]["message"]["content"]
    models = e.http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["my-model"]
    assert models[0]["aliases"] == sorted({"my-model", smollm_path.name, smollm_path.stem})
    # -np 2 without -kvu: a KV buffer per slot, so each slot holds half of -c, as llama-server reports it
    props = e.http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 1024 and props["total_slots"] == 2
    assert props["default_generation_settings"]["params"]["seed"] == props["default_generation_settings"]["seed"]
    assert props["model_alias"] == "my-model" and props["model_path"] == str(smollm_path)
    assert [s["n_ctx"] for s in e.http.get("/slots").json()] == [1024, 1024]

    # any other name is served by the one model loaded, as llama-server serves it, and the answer
    # names the model that answered
    for name in ("gpt-4o-mini", smollm_path.name, None):
        other = chat(e, name)
        assert other.status_code == 200, (name, other.text)
        assert other.json()["model"] == "my-model"
        assert other.json()["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
    emb = e.http.post("/v1/embeddings", json={"input": "hello", "model": "text-embedding-3-small"})
    assert emb.status_code == 200 and emb.json()["model"] == "my-model", emb.text
    messages = e.http.post("/v1/messages", json={"model": "claude-sonnet-4-5", "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "Hi"}]})
    assert messages.status_code == 200 and messages.json()["model"] == "my-model", messages.text
    # the command line alone opens one port, as llama-server's does: no merged RPC port
    assert "merged RPC port" not in e.log()


@pytest.mark.model
def test_a_config_file_wins_over_the_flags_and_keeps_them_across_a_reload(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    port = free_port()
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "strict", "http": {"port": port, "strict_model_names": True}, "rpc": {"port": free_port()},
        "defaults": {"n_ctx": 1024, "n_threads": 1, "temperature": 0}}))
    flag_port = free_port()
    e = start_engine(name="strict", port=port, flags=[
        "--config", str(cfg), "-m", str(smollm_path), "--alias", "my-model,gpt-4o-mini", "--port", str(flag_port),
        "-c", "2048", "-np", "2", "--api-key", KEY, "--embeddings", "--pooling", "mean", "--no-slots"])
    e.http.headers["Authorization"] = f"Bearer {KEY}"
    e.wait_ready(120)
    props = e.http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 2  # file's / flag's
    # --no-slots: GET /slots answers 501, as llama-server's does
    no_slots = e.http.get("/slots")
    assert no_slots.status_code == 501 and no_slots.json()["error"]["code"] == "not_supported", no_slots.text
    log = e.log()
    assert "hydrad: warning: --port is overridden by the config file's http.port" in log
    assert "hydrad: warning: -c is overridden by the config file's defaults.n_ctx" in log
    assert "hydrad: warning: --api-key: a key on the command line can be read by every user" in log

    # the key from the command line guards inference
    assert e.http.post("/v1/chat/completions", headers={"Authorization": ""},
                       json={"messages": [{"role": "user", "content": "Hi"}]}).status_code == 401
    # strict: the model's names answer (each alias too), another name is a 404 that names both
    for name in ("my-model", "gpt-4o-mini", smollm_path.stem):
        r = chat(e, name)
        assert r.status_code == 200 and r.json()["model"] == "my-model", (name, r.text)
    refused = chat(e, "claude-3")
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'claude-3'" in error["message"] and "'my-model'" in error["message"]
    assert "strict_model_names" in error["message"]
    emb = e.http.post("/v1/embeddings", json={"input": "x", "model": "claude-3"})
    assert emb.status_code == 404 and emb.json()["error"]["code"] == "model_not_found"

    # a SIGHUP re-reads the file over the same command line: nothing the flags set is lost
    readies = e.notify.count("READY=1")
    e.proc.send_signal(signal.SIGHUP)
    e.notify.wait_count("READY=1", readies, timeout=60)
    assert "config re-read failed" not in e.log()
    props = e.http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 2
    assert props["model_alias"] == "my-model"


def test_a_flag_hydrad_cannot_honour_ends_the_start_naming_it(tmp_path: Path) -> None:
    bogus = hydrad("--bogus-flag")
    assert bogus.returncode == 2 and bogus.stdout == ""
    assert bogus.stderr.count("\n") == 1 and "--bogus-flag" in bogus.stderr, bogus.stderr
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    mmproj = hydrad("-m", str(model), "--port", "0", "--mmproj-url", "https://example.com/projector.gguf")
    assert mmproj.returncode == 2
    assert mmproj.stderr == ("hydrad: --mmproj-url: not supported: hydrad takes images through a local projector "
                             "file (--mmproj) only: no audio or video, no downloads\n")
    missing = hydrad("-m", str(model), "--port", "0", "--mmproj", "projector.gguf")
    assert (missing.returncode, missing.stderr) == (2, "hydrad: --mmproj: no such file: projector.gguf\n")
    mirostat = hydrad("-m", str(model), "--mirostat", "2")
    assert mirostat.returncode == 2 and mirostat.stderr.startswith("hydrad: --mirostat 2: not supported: ")
    bad = hydrad("-m", str(model), "-c", "lots")
    assert (bad.returncode, bad.stderr) == (2, "hydrad: -c: needs a whole number, got 'lots'\n")
    helped = hydrad("--help")
    assert helped.returncode == 0
    for heading in ("hydrad's own flags:", "llama-server's flags:", "llama-server's flags hydrad refuses:"):
        assert heading in helped.stdout
    assert "--ctx-size N" in helped.stdout and "--lora FNAME" in helped.stdout

"""hydractl as an operator runs it: a real subprocess against a real hydrad subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import httpx
import pytest

from tests.support.cli import field
from tests.support.engine import REPO, Engine, free_port
from tests.support.wait import eventually


def hydractl(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_ENGINE_URL"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO), env=e)


def wait_listening(engine: Engine, timeout: float = 30.0) -> None:
    """A model-less engine never reports 200; wait until /health answers at all."""
    def health() -> httpx.Response:
        engine.assert_running()
        return engine.http.get("/health")

    eventually(health, timeout, "the engine to listen", interval=0.05, ignore=(httpx.TransportError,),
               context=engine.log)


@pytest.fixture
def idle_engine(start_engine: Callable[..., Engine]) -> Engine:
    """An engine started without a model: reachable, configurable, not serving."""
    e = start_engine()
    wait_listening(e)
    return e


# ----- status ----------------------------------------------------------------------------

@pytest.mark.model
def test_status_of_a_serving_engine(smollm_engine: Engine) -> None:
    r = hydractl("status", smollm_engine.url)
    assert r.returncode == 0, r.stderr
    assert field(r.stdout, "model") == "smollm2-135m"
    assert field(r.stdout, "stage") == "ready"
    assert field(r.stdout, "slots") == "0/4 busy"
    assert field(r.stdout, "queued") == "0"
    assert field(r.stdout, "generation").startswith("hydra-")


@pytest.mark.model
def test_status_reads_the_url_from_the_environment(smollm_engine: Engine) -> None:
    r = hydractl("status", "--json", env={"HYDRA_ENGINE_URL": smollm_engine.url})
    assert r.returncode == 0, r.stderr
    assert '"model": "smollm2-135m"' in r.stdout


def test_status_of_a_model_less_engine(idle_engine: Engine) -> None:
    r = hydractl("status", idle_engine.url)
    assert r.returncode == 3, r.stdout + r.stderr
    assert field(r.stdout, "stage") == "idle"
    assert field(r.stdout, "model") == "-"


def test_status_of_an_unreachable_engine() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = hydractl("status", url)
    assert r.returncode == 1
    assert url in r.stderr
    assert "cannot reach" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


# ----- configure -------------------------------------------------------------------------

@pytest.mark.model
def test_configure_t1_t2_and_no_change(smollm_engine: Engine) -> None:
    url = smollm_engine.url
    r = hydractl("configure", url, "temperature=0.3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "applied T1 (apply): temperature"

    r = hydractl("configure", url, "n_ctx=2048")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("applied T2 (rebuild_context): n_ctx in ")
    assert r.stdout.rstrip().endswith("s")

    r = hydractl("configure", url, "n_ctx=2048")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no change"

    params = smollm_engine.http.get("/control/config").json()["params"]
    assert params["temperature"]["value"] == 0.3
    assert params["n_ctx"]["value"] == 2048


@pytest.mark.model
def test_configure_keeps_on_a_string(smollm_engine: Engine) -> None:
    r = hydractl("configure", smollm_engine.url, "flash_attn=on")
    assert r.returncode == 0, r.stderr
    assert "flash_attn" in r.stdout
    assert smollm_engine.http.get("/control/config").json()["params"]["flash_attn"]["value"] == "on"


def test_configure_refuses_a_start_only_field(idle_engine: Engine) -> None:
    r = hydractl("configure", idle_engine.url, "http=1")
    assert r.returncode == 2
    assert "http" in r.stderr
    assert "400" in r.stderr
    assert "Traceback" not in r.stderr


def test_configure_refuses_an_unknown_model(idle_engine: Engine) -> None:
    r = hydractl("configure", idle_engine.url, "model=no-such-model")
    assert r.returncode == 2
    assert "404" in r.stderr
    assert "no-such-model" in r.stderr


def test_configure_on_an_unreachable_engine() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = hydractl("configure", url, "temperature=0.3")
    assert r.returncode == 1
    assert url in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.model
def test_configure_loads_a_model_and_follows_it(idle_engine: Engine, smollm_path: Path) -> None:
    r = hydractl("configure", idle_engine.url, "model=smollm2-135m")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "loading smollm2-135m (load 1)"
    assert lines[-1].startswith("loaded smollm2-135m in ")
    assert "done 100%" in r.stderr  # stderr is a pipe here: one line per 10%, no \r
    assert "\r" not in r.stderr

    r = hydractl("status", idle_engine.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert field(r.stdout, "model") == "smollm2-135m"


@pytest.mark.model
def test_configure_no_wait_returns_at_once(idle_engine: Engine, smollm_path: Path) -> None:
    r = hydractl("configure", idle_engine.url, "model=smollm2-135m", "--no-wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "loading smollm2-135m (load 1)"
    assert r.stderr == ""
    idle_engine.wait_ready()


def test_configure_reports_a_failed_load(idle_engine: Engine, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf" * 100)
    r = hydractl("configure", idle_engine.url, f"model={bogus}")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "load 1 of bogus failed" in r.stderr
    assert "Traceback" not in r.stderr

    r = hydractl("status", idle_engine.url)
    assert r.returncode == 3
    assert "failed" in field(r.stdout, "last_error")


# ----- config ----------------------------------------------------------------------------

def test_config_shows_runtime_overrides(idle_engine: Engine) -> None:
    r = hydractl("config", idle_engine.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split() == ["name", "value", "source", "tier"]
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:]}
    assert rows["n_ctx"] == ["4096", "yaml", "T2"]
    assert rows["model"] == ["null", "default", "T3"]

    assert hydractl("configure", idle_engine.url, "n_ctx=2048").returncode == 0
    r = hydractl("config", idle_engine.url)
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:]}
    assert rows["n_ctx"] == ["2048", "runtime", "T2"]
    assert rows["temperature"] == ["0.8", "default", "T1"]


def test_help_names_every_command() -> None:
    r = hydractl("--help")
    assert r.returncode == 0
    for command in ("status", "configure", "config"):
        assert command in r.stdout

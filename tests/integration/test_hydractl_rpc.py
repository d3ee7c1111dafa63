"""hydractl on the merged RPC port: info, state get/put/meta and migrate, run as a real subprocess
against real hydrad subprocesses (two SmolLM2 engines, one Gemma engine for the refusals).

The engines are shared by the whole module; every test pins its requests to its own slots
(``id_slot``) so the tests do not see each other's KV cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from hydrad.wire import protocol as P
from tests.support.cli import field
from tests.support.engine import GEMMA, REPO, SMOLLM, Engine, free_port, models_dir

pytestmark = pytest.mark.model

# Numbered, varied sentences: a prompt that no other test's prompt shares a prefix with.
WORDS = ("river stone lantern copper meadow harbor violet engine orchard candle silver thunder "
         "pepper canyon marble falcon garden ribbon comet willow anchor basket crystal dragon").split()


def hydractl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_ENGINE_URL", "HYDRA_RPC_TOKEN")}
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydractl", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO), env=env)


def rpc_addr(engine: Engine) -> str:
    return f"127.0.0.1:{yaml.safe_load(engine.config.read_text())['rpc']['port']}"


def prompt_text(tag: str, sentences: int) -> str:
    out = [f"Notes of the {tag} survey."]
    for i in range(sentences):
        a, b, c = (WORDS[(i * k + len(tag)) % len(WORDS)] for k in (1, 3, 7))
        out.append(f"Entry {i} of {tag}: the {a} near the {b} was counted as {i * 17 % 101} {c}s.")
    return " ".join(out)


def complete(engine: Engine, prompt: str, slot: int, max_tokens: int = 1, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "id_slot": slot, **extra}
    r = engine.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def slot_tokens(engine: Engine) -> dict[int, int]:
    r = engine.http.get("/slots")
    assert r.status_code == 200, r.text
    return {s["id"]: s["n_tokens"] for s in r.json()}


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hydractl: "), r.stderr
    return lines[0]


def read_frames(path: Path) -> list[P.Frame]:
    dec = P.FrameDecoder(P.RESPONSE_CODES)
    frames = dec.feed(path.read_bytes())
    dec.eof()
    return frames


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    for f in (SMOLLM, GEMMA):
        if not (models_dir() / f).is_file():
            pytest.skip(f"model file {models_dir() / f} is missing (scripts/setup fetches it)")
    tmp = tmp_path_factory.mktemp("hydractl-rpc")
    started: dict[str, Engine] = {}
    try:
        for name, model in (("a", "smollm2-135m"), ("b", "smollm2-135m"), ("g", "gemma3-270m")):
            # one thread each: three engines share the machine, and ggml's spinning worker threads
            # slow down badly when they have to wait for a core
            started[name] = Engine(tmp, defaults={"model": model, "temperature": 0, "n_threads": 1}, name=name)
        for e in started.values():
            e.wait_ready(timeout=120)
        yield started
    finally:
        for e in started.values():
            e.stop()


# ----- info ------------------------------------------------------------------------------

def test_info_over_the_rpc_port(engines: dict[str, Engine]) -> None:
    a = engines["a"]
    addr = rpc_addr(a)
    r = hydractl("info", addr, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["engine"] == "a" and info["stage"] == "ready"
    assert info["model"]["id"] == "smollm2-135m" and info["model"]["arch"] == "llama"
    assert len(info["slots"]) == 4

    r = hydractl("info", addr)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert field(out, "engine") == f"a  ({addr})"
    assert field(out, "stage") == "ready"
    assert field(out, "model") == "smollm2-135m"
    assert field(out, "arch").startswith("llama, ")
    assert field(out, "fingerprint") == info["model"]["fingerprint"] != ""
    assert field(out, "slots").startswith("0/4 busy")
    slot_lines = [line.split() for line in out.splitlines() if line.startswith("  slot ")]
    assert [(int(w[1]), w[2], w[4]) for w in slot_lines] == [(i, "idle", "tokens") for i in range(4)]
    devices = info["rpc"]["ggml_rpc_devices"]
    if devices:
        assert devices[0]["name"] in field(out, "devices")
    else:
        assert field(out, "devices").startswith("-")


def test_info_unreachable_exits_1_without_a_traceback() -> None:
    addr = f"127.0.0.1:{free_port()}"
    r = hydractl("info", addr)
    assert r.returncode == 1
    line = one_line_error(r)
    assert addr in line and "cannot reach" in line


def test_info_on_the_http_port_exits_1(engines: dict[str, Engine]) -> None:
    http_addr = engines["a"].url.removeprefix("http://")
    r = hydractl("info", http_addr, "--timeout", "2")
    assert r.returncode == 1
    line = one_line_error(r)
    assert http_addr in line
    assert "not its HTTP port" in line or "RPC protocol" in line


# ----- state get / put / meta ------------------------------------------------------------

def test_state_get_file_put_then_continue_without_prefill(engines: dict[str, Engine], tmp_path: Path) -> None:
    a, b = engines["a"], engines["b"]
    prompt = prompt_text("state-file", 12)
    first = complete(a, prompt, slot=1)
    n_prompt = first["usage"]["prompt_tokens"]
    held = slot_tokens(a)[1]
    assert held >= n_prompt

    r = hydractl("state", "meta", rpc_addr(a), "--slot", "1")
    assert r.returncode == 0, r.stderr
    assert int(field(r.stdout, "n_tokens")) == held
    assert field(r.stdout, "model").startswith("smollm2-135m")

    out = tmp_path / "slot1.kv"
    r = hydractl("state", "get", rpc_addr(a), "--slot", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) tokens, (\d+) bytes .* in ([0-9.]+)s", r.stdout)
    assert m, r.stdout
    assert int(m.group(1)) == held
    assert [p.name for p in tmp_path.iterdir()] == ["slot1.kv"]  # the temporary file was renamed away

    frames = read_frames(out)
    assert frames[0].code == P.Status.STATE_META and frames[-1].code == P.Status.STATE_END
    assert {f.code for f in frames[1:-1]} == {P.Status.STATE_DATA}
    meta = frames[0].json()
    assert meta["n_tokens"] == held and meta["bytes"] == int(m.group(2))
    assert sum(len(f.payload) for f in frames[1:-1]) == meta["bytes"]
    # exactly the stream of a STATE_GET: the HTTP twin serves the same bytes for the unchanged slot
    assert a.http.get("/slots/1/state").content == out.read_bytes()

    assert slot_tokens(b)[2] == 0
    r = hydractl("state", "put", rpc_addr(b), "--slot", "2", "-i", str(out))
    assert r.returncode == 0, r.stderr
    assert f"{held} tokens" in r.stdout
    assert slot_tokens(b)[2] == held

    cont = complete(b, prompt, slot=2, max_tokens=8)
    assert cont["usage"]["prompt_tokens"] == n_prompt
    cached = cont["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= n_prompt - 1, (cached, n_prompt)


def test_state_errors_leave_no_file_and_no_change(engines: dict[str, Engine], tmp_path: Path) -> None:
    a, b = engines["a"], engines["b"]
    out = tmp_path / "missing.kv"
    r = hydractl("state", "get", rpc_addr(a), "--slot", "99", "-o", str(out))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "not_found" in line and "slot 99" in line
    assert list(tmp_path.iterdir()) == []

    r = hydractl("state", "meta", rpc_addr(a), "--slot", "99")
    assert r.returncode == 2 and "slot 99" in one_line_error(r)

    # a damaged file (one data byte flipped) is refused before it lands: B's slot 0 keeps its contents
    prompt = prompt_text("damaged", 6)
    complete(a, prompt, slot=3)
    good = tmp_path / "good.kv"
    assert hydractl("state", "get", rpc_addr(a), "--slot", "3", "-o", str(good)).returncode == 0
    complete(b, prompt_text("bystander", 3), slot=0)
    before = slot_tokens(b)[0]
    raw = bytearray(good.read_bytes())
    raw[-200] ^= 0xFF  # inside the last STATE_DATA payload (STATE_END is about 100 bytes)
    bad = tmp_path / "bad.kv"
    bad.write_bytes(bytes(raw))
    r = hydractl("state", "put", rpc_addr(b), "--slot", "0", "-i", str(bad))
    assert r.returncode == 2
    assert "xxh3_128" in one_line_error(r)
    cut = tmp_path / "cut.kv"
    cut.write_bytes(good.read_bytes()[:-50])
    r = hydractl("state", "put", rpc_addr(b), "--slot", "0", "-i", str(cut))
    assert r.returncode == 2 and "not a valid state stream" in one_line_error(r)
    assert slot_tokens(b)[0] == before

    r = hydractl("state", "put", rpc_addr(b), "--slot", "0", "-i", str(tmp_path / "nope.kv"))
    assert r.returncode == 2 and "cannot read" in one_line_error(r)


# ----- migrate ---------------------------------------------------------------------------

def test_migrate_continues_on_b_with_a_s_greedy_continuation(engines: dict[str, Engine]) -> None:
    a, b = engines["a"], engines["b"]
    prompt = prompt_text("migration", 26)
    greedy = {"max_tokens": 24, "ignore_eos": True}
    first = complete(a, prompt, slot=0, **greedy)  # the session: ~500 prompt tokens + 24 generated, in A's slot 0
    n_prompt = first["usage"]["prompt_tokens"]
    assert 400 <= n_prompt <= 650, n_prompt
    held = slot_tokens(a)[0]
    assert held >= n_prompt + 23

    r = hydractl("migrate", "--slot", "0", "--to-slot", "3", rpc_addr(a), rpc_addr(b))
    assert r.returncode == 0, r.stderr
    m = re.search(r"migrated slot 0 of \S+ to slot 3 of \S+: (\d+) tokens, (\d+) bytes \(.*\) in ([0-9.]+)s "
                  r"\((\d+) MB/s\)", r.stdout)
    assert m, r.stdout
    assert int(m.group(1)) == held and int(m.group(2)) > 0
    assert slot_tokens(b)[3] == held
    assert slot_tokens(a)[0] == held  # migration copies; the source keeps its cache

    # Both engines now continue the same session from the same KV: B from the migrated copy, A from
    # its own. (A's first answer is not the reference: it took its first token's logits from the
    # 500-token prefill batch, a different kernel path than a one-token decode, and on a model this
    # small a near-tie can flip on rounding alone.)
    on_b = complete(b, prompt, slot=3, **greedy)
    on_a = complete(a, prompt, slot=0, **greedy)
    for r_ in (on_a, on_b):
        assert r_["usage"]["prompt_tokens"] == n_prompt
        assert r_["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_prompt - 1
        assert r_["usage"]["completion_tokens"] == 24
    assert on_b["choices"][0]["text"] == on_a["choices"][0]["text"], (on_a, on_b, first["choices"][0]["text"])


def test_migrate_into_another_model_is_refused(engines: dict[str, Engine], tmp_path: Path) -> None:
    a, g = engines["a"], engines["g"]
    complete(a, prompt_text("gemma-bound", 5), slot=2)
    assert set(slot_tokens(g).values()) == {0}

    r = hydractl("migrate", "--slot", "2", rpc_addr(a), rpc_addr(g))
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line_error(r)
    assert "incompatible" in line and "another model" in line
    assert set(slot_tokens(g).values()) == {0}

    f = tmp_path / "smol.kv"
    assert hydractl("state", "get", rpc_addr(a), "--slot", "2", "-o", str(f)).returncode == 0
    r = hydractl("state", "put", rpc_addr(g), "--slot", "1", "-i", str(f))
    assert r.returncode == 2 and "another model" in one_line_error(r)
    assert set(slot_tokens(g).values()) == {0}


def test_migrate_to_an_unreachable_engine_exits_1(engines: dict[str, Engine]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    r = hydractl("migrate", "--slot", "0", rpc_addr(engines["a"]), dead)
    assert r.returncode == 1
    line = one_line_error(r)
    assert dead in line and "cannot reach" in line


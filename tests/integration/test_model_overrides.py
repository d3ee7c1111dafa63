"""MoE offload and model overrides on a real engine with a real Mixture-of-Experts GGUF (the tiny one
scripts/make_tiny_moe.py writes): n_cpu_moe and tensor_buft_overrides place the expert tensors (llama.cpp's
own log of the load, read back through /v1/models and the load's record, says which tensors went where),
kv_overrides change what llama.cpp reads from the model (its training context, its BOS flag), the load
mode follows use_mlock and use_direct_io, check_tensors refuses a model with a NaN in an expert, and every
bad value is refused naming its field while the serving model keeps serving. Each change is a model
reload through configure (T3).

(No GPU here: every buffer is the CPU's, so an override to CPU changes no byte count; what the tests
observe is llama.cpp's own account of which tensors an override placed. On a GPU host the same test
shows the experts leaving the GPU's buffer: ``test_on_a_gpu_the_experts_leave_the_gpu_buffer``.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.engine import REPO, Engine

pytestmark = pytest.mark.model

LAYERS = 4
EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
BASE = {"n_threads": 1, "n_ctx": 512, "n_parallel": 1, "temperature": 0}


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_moe.py"), str(out), "--layers", str(LAYERS)],
                   check=True, cwd=str(REPO), capture_output=True, timeout=180)
    return out


@pytest.fixture(scope="module")
def tensor_bytes(moe: Path) -> dict[str, int]:
    gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")
    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(moe).tensors}


@pytest.fixture
def engine(start_engine: Callable[..., Engine], moe: Path) -> Engine:
    e = start_engine(defaults=BASE)
    e.notify.wait_for("READY=1", 60)
    assert load(e, model=str(moe))["load"]["weights"]["overridden_tensors"] == {}
    return e


def load(e: Engine, **payload: Any) -> dict[str, Any]:
    r = e.configure(**payload)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["load"]["phase"] == "done", body
    return body


def refused(e: Engine, status: int, **payload: Any) -> dict[str, Any]:
    r = e.configure(**payload)
    assert r.status_code == status, r.text
    return r.json()["error"]


def model_meta(e: Engine) -> dict[str, Any]:
    data = e.http.get("/v1/models").json()["data"]
    assert len(data) == 1
    return data[0]["meta"]


def completes(e: Engine) -> list[int]:
    r = e.http.post("/completion", json={"prompt": "The capital of France is", "n_predict": 4, "temperature": 0,
                                         "ignore_eos": True, "return_tokens": True})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert len(tokens) == 4, r.text
    return tokens


def experts(tensor_bytes: dict[str, int], layers: range) -> int:
    return sum(tensor_bytes[f"blk.{i}.{p}.weight"] for i in layers for p in EXPERT_PARTS)


def test_n_cpu_moe_and_explicit_overrides_place_the_experts(engine: Engine, moe: Path,
                                                             tensor_bytes: dict[str, int]) -> None:
    before = completes(engine)

    body = load(engine, n_cpu_moe=2)
    assert body["tier"] == "T3" and body["action"] == "reload_model" and body["changed"] == ["n_cpu_moe"]
    seen = body["load"]["weights"]  # llama.cpp's own account of the load
    assert seen["overridden_tensors"] == {"CPU": 2 * len(EXPERT_PARTS)} and seen["n_cpu_moe"] == 2
    estimate = body["load"]["estimate"]["weights"]  # what the load policy and routing counted beforehand
    assert estimate["overridden_bytes"] == {"CPU": experts(tensor_bytes, range(2))}
    assert estimate["overridden_tensors"] == 2 * len(EXPERT_PARTS)
    assert model_meta(engine)["weights"]["overridden_tensors"] == {"CPU": 6}
    assert completes(engine) == before  # the same weights, computed by the same CPU

    # llama.cpp's own name for the list, with n_cpu_moe still in force: one more tensor, listed first
    body = load(engine, tensor_buft_overrides=["token_embd=CPU"])
    assert body["changed"] == ["override_tensors"] and body["load"]["weights"]["overridden_tensors"] == {"CPU": 7}
    config = engine.http.get("/control/config").json()["params"]
    assert config["override_tensors"] == {"value": ["token_embd=CPU"], "source": "runtime", "tier": "T3"}
    assert config["n_cpu_moe"]["value"] == 2

    # every layer's experts (llama-server's --cpu-moe), the explicit entry dropped again
    body = load(engine, n_cpu_moe=99, override_tensors=None)
    assert body["load"]["weights"]["overridden_tensors"] == {"CPU": LAYERS * len(EXPERT_PARTS)}
    assert body["load"]["weights"]["n_cpu_moe"] == LAYERS
    assert body["load"]["estimate"]["weights"]["overridden_bytes"] == {"CPU": experts(tensor_bytes, range(LAYERS))}
    assert completes(engine) == before


def test_kv_overrides_change_what_llama_cpp_reads(engine: Engine) -> None:
    meta = model_meta(engine)
    assert meta["n_ctx_train"] == 4096

    def first_token() -> int:
        r = engine.http.post("/tokenize", json={"content": "Hello", "add_special": True})
        assert r.status_code == 200, r.text
        return r.json()["tokens"][0]

    plain = first_token()
    body = load(engine, kv_overrides=["llama.context_length=int:1024", "tokenizer.ggml.add_bos_token=bool:true"],
                n_ctx=0)  # 0: the model's training context, which the override sets
    assert body["changed"] == ["kv_overrides", "n_ctx"] and body["tier"] == "T3"
    assert body["load"]["weights"]["kv_overrides"] == {"llama.context_length": "1024",
                                                       "tokenizer.ggml.add_bos_token": "true"}
    meta = model_meta(engine)
    assert meta["n_ctx_train"] == 1024 and meta["n_ctx"] == 1024
    bos = first_token()
    assert bos != plain and engine.http.post("/detokenize", json={"tokens": [bos]}).json()["content"] \
        in ("<|im_start|>", "<|endoftext|>")  # SmolLM2's BOS, which its own GGUF does not add
    assert completes(engine)

    load(engine, kv_overrides=None, n_ctx=None)
    assert model_meta(engine)["n_ctx_train"] == 4096 and first_token() == plain


@pytest.mark.parametrize("payload, mode", [
    ({"use_mlock": True}, "mmap+mlock"),
    ({"use_mlock": True, "use_mmap": False}, "mlock"),
    ({"use_direct_io": True}, "dio"),
    ({"use_mmap": False}, "none"),
])
def test_the_load_mode_follows_use_mlock_and_use_direct_io(engine: Engine, payload: dict[str, Any],
                                                           mode: str) -> None:
    body = load(engine, **payload)
    assert body["load"]["weights"]["load_mode"] == mode
    assert completes(engine)


def test_check_tensors_refuses_a_nan_expert(engine: Engine, moe: Path, tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")
    bad = tmp_path / "nan-moe.gguf"
    shutil.copy(moe, bad)
    t = next(t for t in gguf.GGUFReader(bad).tensors if t.name == "blk.1.ffn_up_exps.weight")
    with open(bad, "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(b"\x00\x7e")  # an f16 NaN as the first weight of one expert
    before = completes(engine)
    err = refused(engine, 422, model=str(bad), check_tensors=True)
    assert err["code"] == "load_failed" and err["param"] == "check_tensors"
    assert "has invalid data" in err["message"] and "blk.1.ffn_up_exps.weight" in err["message"], err
    assert completes(engine) == before  # the model that served keeps serving
    load(engine, model=str(bad), check_tensors=False)  # unchecked, llama.cpp loads it as it is
    load(engine, model=str(moe))


def test_bad_values_are_refused_naming_the_field(engine: Engine, moe: Path) -> None:
    before = completes(engine)
    for payload, field, says in [
        ({"kv_overrides": ["llama.context_length=int:12abc"]}, "kv_overrides", "not a whole number"),
        ({"kv_overrides": ["llama.context_length"]}, "kv_overrides", "KEY=TYPE:VALUE"),
        ({"devices": ["none", "CUDA0"]}, "devices", "stands alone"),
        ({"use_mlock": True, "use_direct_io": True}, "use_direct_io", "no load mode"),
        ({"n_cpu_moe": -1}, "n_cpu_moe", "greater than or equal to 0"),
        ({"tensor_buft_overrides": ["a=CPU"], "override_tensors": ["a=CPU"]}, "tensor_buft_overrides", "give one"),
        ({"override_tensors": ["(exps=CPU"]}, "override_tensors", "bad regular expression"),
    ]:
        err = refused(engine, 400, **payload)
        assert err["param"] == field and says in err["message"], (payload, err)
    for payload, says in [
        ({"kv_overrides": ["llama.context_length=float:1024"]}, "kv_overrides: 'llama.context_length' is int"),
        ({"kv_overrides": ["tokenizer.ggml.tokens=str:x"]}, "kv_overrides: 'tokenizer.ggml.tokens' is an array"),
        ({"kv_overrides": ["llama.context_lenght=int:1024"]}, "kv_overrides: llama.cpp did not read "
                                                              "'llama.context_lenght'"),
        ({"devices": ["CUDA7"]}, "devices: 'CUDA7' is no device here"),
        ({"devices": ["CPU"]}, "devices: 'CPU' is the CPU"),
        ({"tensor_buft_overrides": ["exps=CUDA7"]}, "override_tensors: unknown buffer type 'CUDA7'"),
    ]:
        err = refused(engine, 422, **payload)
        field = next(iter(payload)).replace("tensor_buft_overrides", "override_tensors")
        assert err["code"] == "load_failed" and err["param"] == field and says in err["message"], (payload, err)
        assert completes(engine) == before  # a refused load leaves the serving model as it was
    assert engine.http.get("/control/config").json()["params"]["kv_overrides"]["value"] is None


def test_no_device_keeps_every_weight_on_the_cpu(engine: Engine) -> None:
    before = completes(engine)
    body = load(engine, devices=["none"])
    seen = body["load"]["weights"]
    assert seen["devices"] == [] and seen["device_bytes"] == 0 and seen["host_bytes"] > 0
    assert completes(engine) == before


def test_on_a_gpu_the_experts_leave_the_gpu_buffer(engine: Engine, tensor_bytes: dict[str, int]) -> None:
    """With every layer offloaded, n_cpu_moe moves the first layers' experts from the GPU's buffer into
    host memory: llama.cpp's buffer sizes move by the experts' bytes, as the estimate said they would."""
    if model_meta(engine)["weights"]["device_bytes"] == 0:
        pytest.skip("no GPU: every buffer is the CPU's")
    part = load(engine, n_cpu_moe=2)["load"]
    full = load(engine, n_cpu_moe=None)["load"]
    moved = experts(tensor_bytes, range(2))
    gone = full["weights"]["device_bytes"] - part["weights"]["device_bytes"]
    assert abs(gone - moved) <= 64 << 10, (full["weights"], part["weights"])  # buffer sizes are logged in MiB/100
    est_full, est_part = full["estimate"]["weights"], part["estimate"]["weights"]
    assert est_full["device_bytes"] - est_part["device_bytes"] == moved
    assert est_part["host_bytes"] - est_full["host_bytes"] == moved
    assert abs(est_part["device_bytes"] - part["weights"]["device_bytes"]) <= 1 << 20


def test_register_reports_the_weights_a_load_keeps_in_host_memory(moe: Path, smollm_path: Path,
                                                                    tensor_bytes: dict[str, int]) -> None:
    """What routing is told (REGISTER's host_weights), per model on disk, by the parameters the engine would
    load it with: the token embeddings (llama.cpp never offloads them) plus the experts n_cpu_moe keeps on
    the CPU, here from the model's registry defaults. The engine's own core and registry; the device's
    kind is set to a GPU's, since this host has none (a GPU-less engine reports nothing, checked too)."""
    import asyncio

    from hydrad.common.registry import ModelEntry, Registry
    from hydrad.engine.bus.link import EngineLink
    from hydrad.engine.control import EngineControl
    from hydrad.engine.core import EngineCore
    from hydrad.engine.settings import EngineSettings
    from hydrad.wire import messages as M

    registry = Registry(moe.parent, {"moe": ModelEntry(path=str(moe), defaults={"n_cpu_moe": 2}),
                                     "smol": ModelEntry(path=str(smollm_path))})

    async def scenario() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        core = EngineCore()
        core.start(asyncio.get_running_loop())
        try:
            control = EngineControl(core, registry, {})
            link = EngineLink(EngineSettings(name="t", bus={"endpoint": "tcp://127.0.0.1:9"}), control, http=None,
                              rpc=None)
            await link._refresh_gpu()  # this host's own device: a CPU
            cpu = link._register().host_weights
            link._gpu = M.GpuInfo(name="CUDA0", kind="gpu", arch="sm_90", vram_total=80 << 30, vram_free=80 << 30)
            gpu = await asyncio.to_thread(link._host_weights, link._models_on_disk())
            control.layers.runtime = {"n_gpu_layers": 0}  # a configure's layer applies to an on-demand load too
            none = await asyncio.to_thread(link._host_weights, link._models_on_disk())
            return cpu, gpu, none
        finally:
            core.stop()
            await asyncio.to_thread(core.join, 10)

    cpu, gpu, none = asyncio.run(scenario())
    assert cpu == {}
    embd = tensor_bytes["token_embd.weight"]
    assert gpu["moe"] == embd + experts(tensor_bytes, range(2))
    from hydrad.engine import gguf_meta

    smol = gguf_meta.tensor_table(smollm_path)
    assert gpu["smol"] == smol.sizes["token_embd.weight"]
    assert none["smol"] == smol.total and none["moe"] == sum(tensor_bytes.values())  # nothing offloaded


def test_the_front_door_serves_a_profile_that_offloads_experts(tmp_path: Path, moe: Path,
                                                               start_engine: Callable[..., Engine]) -> None:
    """The design's own profile shape, ``{model, params: {n_cpu_moe: N}}``, through a real coordinator: the
    engine loads the MoE with that layer's experts on the CPU, and a chat through the front door is served."""
    import yaml

    from tests.support.coordinator import Coordinator

    registry = tmp_path / "models.yaml"
    registry.write_text(yaml.safe_dump({"models": {"tiny-moe": {"path": moe.name, "arch": "llama",
                                                                "description": "the tiny MoE of the tests"}}}))
    profiles = {"profiles": {"moe": {"description": "a MoE with two layers' experts on the CPU",
                                     "engines": {"solo": {"model": "tiny-moe", "params": {"n_cpu_moe": 2}}}}},
                "default": "moe"}
    c = Coordinator(tmp_path, profiles=profiles, heartbeat_interval_s=0.5, extra={"registry": str(registry)})
    try:
        c.wait_ready()
        e = start_engine(name="solo", defaults=BASE,
                         extra={"registry": str(registry), "models_dir": str(moe.parent),
                                "bus": c.engine_bus(heartbeat_interval_s=0.5)})
        c.wait_engines(lambda es: es.get("solo", {}).get("model") == "tiny-moe"
                       and es["solo"].get("stage") == "ready", timeout=120)
        assert model_meta(e)["weights"]["overridden_tensors"] == {"CPU": 2 * len(EXPERT_PARTS)}
        r = c.http.post("/v1/completions", json={"model": "tiny-moe", "prompt": "The capital of France is",
                                                 "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert r.json()["choices"][0]["text"] == e.http.post("/v1/completions", json={
            "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}).json()["choices"][0]["text"]
    finally:
        c.stop()

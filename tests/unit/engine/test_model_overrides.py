"""MoE offload and model overrides, the parts that need no engine: the parameters' validation (kv_overrides
as llama-server's --override-kv parses them, devices, the load mode's combinations, llama.cpp's own name
tensor_buft_overrides), the override list n_cpu_moe builds (llama-server's per-layer expert regex), the
estimate of where the weights go, the load mode and the kv override structs handed to llama.cpp, and
what is read back from llama.cpp's log of a load."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hydrad.common.modeloverrides import parse_kv_override
from hydrad.common.params import (
    ParamError,
    ParamLayers,
    RuntimeParams,
    check_partial,
    validation_message,
)
from hydrad.common.registry import ModelEntry
from hydrad.coordinator.profiles import EngineEntry
from hydrad.engine import gguf_meta, llama, weights
from hydrad.engine.loadreport import LoadReport
from hydrad.engine.gguf_meta import TensorTable
from hydrad.engine.loader import choose_policy

# ----------------------------------------------------------------------------- kv_overrides


@pytest.mark.parametrize("item, key, kind, value", [
    ("llama.context_length=int:2048", "llama.context_length", "int", 2048),
    ("a.b=int:-7", "a.b", "int", -7),
    ("rope.scale=float:0.25", "rope.scale", "float", 0.25),
    ("tokenizer.ggml.add_bos_token=bool:false", "tokenizer.ggml.add_bos_token", "bool", False),
    ("flag=bool:true", "flag", "bool", True),
    ("general.name=str:a=b:c", "general.name", "str", "a=b:c"),  # the first '=' ends the key, as in llama-server
    ("general.name=str:", "general.name", "str", ""),
])
def test_kv_override_parses_as_llama_server_does(item: str, key: str, kind: str, value: Any) -> None:
    kv = parse_kv_override(item)
    assert (kv.key, kv.type, kv.value) == (key, kind, value)
    assert type(kv.value) is type(value)
    assert parse_kv_override(kv.text) == kv  # reported back in the same syntax


@pytest.mark.parametrize("item, says", [
    ("no-equals", "KEY=TYPE:VALUE"),
    ("=int:1", "KEY=TYPE:VALUE"),
    ("k=int", "type must be one of int, float, bool, str"),
    ("k=long:1", "type must be one of int, float, bool, str"),
    ("k=int:12abc", "not a whole number"),  # llama-server's atol would load 12
    ("k=int:", "not a whole number"),
    ("k=int:9223372036854775808", "64-bit"),
    ("k=float:fast", "not a number"),
    ("k=float:nan", "finite"),
    ("k=float:inf", "finite"),
    ("k=bool:yes", "true or false"),
    ("k=bool:True", "true or false"),
    ("k=str:" + "x" * 128, "at most 127 bytes"),
    ("k=str:" + "é" * 64, "at most 127 bytes"),  # bytes, not characters
    ("k" * 128 + "=int:1", "at most 127 bytes"),
    (" k=int:1", "printable"),
])
def test_kv_override_refusals_name_the_problem(item: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_kv_override(item)
    with pytest.raises(ValidationError) as exc:
        RuntimeParams(kv_overrides=[item])
    msg, names = validation_message(exc.value)
    assert names == ["kv_overrides"] and says in msg


def test_a_key_overridden_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="overridden twice"):
        RuntimeParams(kv_overrides=["a=int:1", "a=int:2"])


def test_kv_override_structs_hold_each_value_in_its_union_member() -> None:
    """The array handed to llama.cpp: its own struct type, one entry per override, then an empty key."""
    items = [parse_kv_override(s) for s in ("i=int:-3", "f=float:1.5", "b=bool:true", "s=str:héllo")]
    arr = llama.kv_override_array(items)
    C = llama.lib()
    assert isinstance(arr[0], C.llama_model_kv_override) and len(arr) == 5
    assert [(e.key, e.tag) for e in arr] == [(b"i", 0), (b"f", 1), (b"b", 2), (b"s", 3), (b"", 0)]
    assert arr[0].value.val_i64 == -3 and arr[1].value.val_f64 == 1.5 and arr[2].value.val_bool is True
    assert arr[3].value.val_str == "héllo".encode()
    assert ctypes.sizeof(arr[0]) == 4 + 4 + 128 + 128  # tag, padding to 8, key[128], the union's char[128]


# ----------------------------------------------------------------------------- other fields


@pytest.mark.parametrize("payload, field, says", [
    ({"devices": []}, "devices", "at least 1"),
    ({"devices": ["none", "CUDA0"]}, "devices", "'none' stands alone"),
    ({"devices": ["CUDA0,CUDA1"]}, "devices", "one name per entry"),
    ({"devices": ["CUDA0", "cuda0"]}, "devices", "named twice"),
    ({"n_cpu_moe": -1}, "n_cpu_moe", "greater than or equal to 0"),
    ({"n_cpu_moe": 5000}, "n_cpu_moe", "less than or equal to 4096"),
    ({"use_mlock": True, "use_direct_io": True}, "use_direct_io", "no load mode that locks a direct read"),
    ({"tensor_buft_overrides": ["exps"]}, "override_tensors", "REGEX=BUFFER_TYPE"),
    ({"check_tensors": "sometimes"}, "check_tensors", "valid boolean"),
])
def test_refusals_name_the_field(payload: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ValidationError) as exc:
        RuntimeParams(**payload)
    msg, names = validation_message(exc.value)
    assert names == [field] and says in msg, msg
    with pytest.raises(ParamError) as perr:  # a configure payload: a 400 naming the field
        ParamLayers().plan(payload)
    assert perr.value.fields == [field] and says in str(perr.value)


def test_devices_is_a_runtime_field_and_none_alone_means_no_device() -> None:
    assert RuntimeParams(devices=["none"]).devices == ["none"]
    assert RuntimeParams(devices=["CUDA0", "CUDA1"]).devices == ["CUDA0", "CUDA1"]
    plan = ParamLayers().plan({"devices": ["CUDA1"]})
    assert plan.changed == ["devices"] and plan.tier.action == "reload_model"


@pytest.mark.parametrize("field, value", [
    ("devices", ["none"]), ("n_cpu_moe", 8), ("override_tensors", ["token_embd=CPU"]),
    ("kv_overrides", ["general.name=str:x"]), ("use_mlock", True), ("use_direct_io", True),
    ("check_tensors", True), ("no_host", True),
])
def test_each_is_a_model_reload(field: str, value: Any) -> None:
    plan = ParamLayers(yaml={"model": "m"}).plan({field: value})
    assert plan.changed == [field] and plan.tier.action == "reload_model"


def test_llama_cpps_name_of_the_overrides_is_the_same_parameter() -> None:
    """tensor_buft_overrides (common_params' name) is accepted wherever override_tensors is, and reported
    under the project's name; a payload holding both spellings is refused naming them."""
    items = ["token_embd=CPU", "output=CPU"]
    assert RuntimeParams(tensor_buft_overrides=items).override_tensors == items
    layers = ParamLayers(yaml={"model": "m", "n_gpu_layers": 99})
    plan = layers.plan({"n_cpu_moe": 8, "tensor_buft_overrides": items})  # the design's MoE example
    assert plan.changed == ["n_cpu_moe", "override_tensors"] and plan.runtime["override_tensors"] == items
    layers.commit(plan)
    assert layers.sources()["override_tensors"] == {"value": items, "source": "runtime", "tier": "T3"}
    assert layers.plan({"tensor_buft_overrides": None}).effective.override_tensors is None  # null drops it too
    with pytest.raises(ParamError) as exc:
        layers.plan({"tensor_buft_overrides": items, "override_tensors": items})
    assert exc.value.fields == ["tensor_buft_overrides"] and "give one" in str(exc.value)
    assert check_partial({"tensor_buft_overrides": items}) == {"override_tensors": items}  # YAML defaults
    entry = ModelEntry(path="m.gguf", defaults={"tensor_buft_overrides": items, "n_cpu_moe": 2})
    assert entry.defaults == {"override_tensors": items, "n_cpu_moe": 2}  # a registry entry's defaults
    yaml_layer = ParamLayers(yaml=check_partial({"tensor_buft_overrides": items}))
    assert yaml_layer.sources()["override_tensors"]["source"] == "yaml"


def test_a_profile_entry_owns_the_overrides_under_either_name() -> None:
    with pytest.raises(ValidationError, match="set by the entry's model/mode, not params: tensor_buft_overrides"):
        EngineEntry(model="moe", params={"tensor_buft_overrides": ["exps=CPU"]})
    entry = EngineEntry(model="moe", override_tensors=("token_embd=CPU",), params={"n_gpu_layers": 99, "n_cpu_moe": 8})
    assert entry.params["n_cpu_moe"] == 8


# ----------------------------------------------------------------------------- the patterns n_cpu_moe builds


def test_n_cpu_moe_builds_llama_servers_per_layer_expert_patterns() -> None:
    assert weights.cpu_moe_patterns(3) == [
        r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
        r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps",
        r"blk\.2\.ffn_(up|down|gate|gate_up)_(ch|)exps",
    ]
    assert weights.cpu_moe_patterns(0) == []
    assert len(weights.cpu_moe_patterns(99, n_layer=4)) == 4  # capped at the model's layers: --cpu-moe
    assert len(weights.cpu_moe_patterns(3, n_layer=0)) == 3  # layer count unknown: as asked


@pytest.mark.parametrize("name, layer", [
    ("blk.1.ffn_up_exps.weight", 1), ("blk.1.ffn_down_exps.weight", 1), ("blk.1.ffn_gate_exps.weight", 1),
    ("blk.1.ffn_gate_up_exps.weight", 1), ("blk.1.ffn_up_chexps.weight", 1), ("blk.1.ffn_down_exps.bias", 1),
    ("blk.10.ffn_up_exps.weight", 10), ("blk.11.ffn_gate_exps.weight", 11),
    ("blk.1.ffn_gate_inp.weight", None), ("blk.1.ffn_up_shexp.weight", None), ("blk.1.ffn_up.weight", None),
    ("blk.1.attn_q.weight", None), ("token_embd.weight", None),
])
def test_the_patterns_match_the_expert_tensors_of_their_layer_only(name: str, layer: int | None) -> None:
    pats = weights.cpu_moe_patterns(12)
    hits = [i for i, p in enumerate(pats) if re.search(p, name)]
    assert hits == ([] if layer is None else [layer])  # blk.1's pattern never takes blk.10's or blk.11's


def test_explicit_overrides_come_before_n_cpu_moes() -> None:
    p = RuntimeParams(n_cpu_moe=2, override_tensors=[r"blk\.0\.ffn_up_exps=RPC", "token_embd=CPU"])
    assert weights.tensor_overrides(p, n_layer=4) == [
        (r"blk\.0\.ffn_up_exps", "RPC"), ("token_embd", "CPU"),
        (r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
        (r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
    ]


# ----------------------------------------------------------------------------- where the weights go

EXP = 1000  # bytes of one expert tensor
TABLE = TensorTable(sizes={
    "token_embd.weight": 50_000, "output_norm.weight": 10,
    **{f"blk.{i}.{t}": n for i in range(4) for t, n in (
        ("attn_q.weight", 100), ("ffn_gate_inp.weight", 20), ("ffn_up_exps.weight", EXP),
        ("ffn_down_exps.weight", EXP), ("ffn_gate_exps.weight", EXP))},
}, n_layer=4, split=False)
LAYER = 100 + 20 + 3 * EXP


def test_all_offloaded_keeps_only_the_input_layer_on_the_host_and_copies_the_tied_output() -> None:
    w = weights.split(TABLE, RuntimeParams(), local_gpus=1)
    assert w.host == 50_000  # token_embd: llama.cpp never offloads the input layer
    assert w.device == 4 * LAYER + 10 + 50_000  # the layers, output_norm, and the tied output's own copy
    assert w.overridden == {} and w.peer == 0


def test_n_cpu_moe_moves_the_experts_of_the_first_layers_to_host_memory() -> None:
    w = weights.split(TABLE, RuntimeParams(n_cpu_moe=2), local_gpus=1)
    assert w.overridden == {"CPU": 6 * EXP} and w.overridden_tensors == 6
    assert w.host == 50_000 + 6 * EXP
    assert w.device == 4 * LAYER - 6 * EXP + 10 + 50_000
    every = weights.split(TABLE, RuntimeParams(n_cpu_moe=99), local_gpus=1)  # --cpu-moe
    assert every.host == 50_000 + 12 * EXP


def test_the_designs_moe_example() -> None:
    """{n_gpu_layers: 99, n_cpu_moe: 8, override_tensors: [token_embd=CPU, output=CPU, output_norm=CPU]}: with
    tied embeddings the output is token_embd's copy, which the first entry keeps on the CPU too."""
    p = RuntimeParams(n_gpu_layers=99, n_cpu_moe=8,
                      tensor_buft_overrides=["token_embd=CPU", "output=CPU", "output_norm=CPU"])
    w = weights.split(TABLE, p, local_gpus=1)
    assert w.device == 4 * (100 + 20)  # attention and routers only
    assert w.host == 50_000 + 10 + 12 * EXP  # the copy of a CPU tensor costs no more memory


def test_layers_not_offloaded_stay_on_the_host_and_none_means_no_device() -> None:
    w = weights.split(TABLE, RuntimeParams(n_gpu_layers=2), local_gpus=1)  # the output layer and blk.3
    assert w.device == LAYER + 10 + 50_000 and w.host == 3 * LAYER + 50_000
    for p, gpus in ((RuntimeParams(devices=["none"]), 1), (RuntimeParams(n_gpu_layers=0), 1), (RuntimeParams(), 0)):
        w = weights.split(TABLE, p, local_gpus=gpus)
        assert w.device == 0 and w.host == TABLE.total, p


def test_a_peers_device_is_neither_vram_nor_host_memory() -> None:
    w = weights.split(TABLE, RuntimeParams(override_tensors=[r"\.ffn_(up|down|gate)_exps=RPC0"]), local_gpus=1)
    assert w.peer == 12 * EXP and w.overridden == {"RPC0": 12 * EXP}


def test_the_tensor_table_of_a_real_gguf(smollm_path: Path) -> None:
    t = gguf_meta.tensor_table(smollm_path)
    assert t.n_layer == 30 and not t.split and len(t.sizes) == 272
    assert t.sizes["blk.0.attn_norm.weight"] == 576 * 4  # f32 norm of n_embd 576: exact (no padding needed)
    size = smollm_path.stat().st_size
    assert size - (4 << 20) < t.total < size  # everything but the header (the vocabulary)
    kinds = gguf_meta.key_kinds(smollm_path)
    assert kinds["llama.context_length"] == "int" and kinds["tokenizer.ggml.add_bos_token"] == "bool"
    assert kinds["general.name"] == "str" and kinds["tokenizer.ggml.tokens"] == "array"
    assert kinds["llama.rope.freq_base"] == "float"


def test_host_bytes_for_routing_follow_the_parameters(smollm_path: Path) -> None:
    plain = weights.host_bytes(smollm_path, RuntimeParams(), 1)
    assert plain == gguf_meta.tensor_table(smollm_path).sizes["token_embd.weight"]
    assert weights.host_bytes(smollm_path, RuntimeParams(n_gpu_layers=0), 1) == gguf_meta.tensor_table(smollm_path).total


# ----------------------------------------------------------------------------- the load policy


def test_the_host_part_must_fit_the_host_too() -> None:
    gb = 1 << 30
    chosen, why = choose_policy("auto", need=2 * gb, free=4 * gb, has_current=True, host_need=8 * gb, host_free=6 * gb)
    assert chosen == "drain" and "host-memory" in why["why"] and why["host_need_bytes"] == 8 * gb
    chosen, why = choose_policy("auto", need=2 * gb, free=4 * gb, has_current=True, host_need=5 * gb, host_free=6 * gb)
    assert chosen == "overlap"
    chosen, _ = choose_policy("auto", need=2 * gb, free=4 * gb, has_current=True, host_need=5 * gb, host_free=0)
    assert chosen == "overlap"  # host memory unknown: not held against the load


# ----------------------------------------------------------------------------- llama.cpp's side


@pytest.mark.parametrize("kw, mode", [
    ({}, -1), ({"use_mmap": False}, 0), ({"use_mlock": True}, 3), ({"use_mlock": True, "use_mmap": False}, 2),
    ({"use_direct_io": True}, 4), ({"use_direct_io": True, "use_mmap": False}, 4),
])
def test_load_mode_as_llama_server_names_it(kw: dict[str, Any], mode: int) -> None:
    C = llama.lib()
    assert llama.load_mode(RuntimeParams(**kw)) == mode
    names = {-1: None, 0: b"none", 2: b"mlock", 3: b"mmap+mlock", 4: b"dio"}
    if names[mode] is not None:
        assert C.llama_load_mode_name(mode) == names[mode]


def test_the_load_report_reads_llama_cpps_lines() -> None:
    text = (
        "llama_model_loader: loaded meta data with 40 key-value pairs\n"
        "validate_override: Using metadata override (  int) 'llama.context_length' = 1024\n"
        "validate_override: Using metadata override ( bool) 'tokenizer.ggml.add_bos_token' = true\n"
        "validate_override: Warning: Bad metadata override type for key 'x.y', expected int but got str\n"
        "load_tensors: loading model tensors, this can take a while... (load_mode = mmap+mlock)\n"
        "tensor blk.0.ffn_up_exps.weight (0 MiB f16) buffer type overridden to CPU\n"
        "tensor blk.0.ffn_down_exps.weight (0 MiB f16) buffer type overridden to CPU_REPACK\n"
        "load_tensors:   CPU_Mapped model buffer size =     6.85 MiB\n"
        "load_tensors:        CUDA0 model buffer size =   100.00 MiB\n"
    )
    rep = LoadReport.parse(text)
    assert rep.load_mode == "mmap+mlock"
    assert rep.kv_applied == {"llama.context_length": "1024", "tokenizer.ggml.add_bos_token": "true"}
    assert rep.kv_refused == {"x.y": "llama.cpp reads it as int, the override is str"}
    assert rep.overridden == {"blk.0.ffn_up_exps.weight": "CPU", "blk.0.ffn_down_exps.weight": "CPU_REPACK"}
    assert rep.buffers == {"CPU_Mapped": round(6.85 * (1 << 20)), "CUDA0": 100 << 20}
    assert rep.public()["overridden_tensors"] == {"CPU": 1, "CPU_REPACK": 1}

"""Runtime parameters: descriptions and tiers, layering, configure plans, snapshot hashes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hydrad.common.params import (
    T4_FIELDS,
    ConfigurePlan,
    ParamError,
    ParamLayers,
    RuntimeParams,
    Tier,
    validation_message,
)

FIELDS = list(RuntimeParams.model_fields)

T3_KEY = ["model", "n_gpu_layers", "split_mode", "tensor_split", "main_gpu", "use_mmap", "no_host", "rpc_servers",
          "override_tensors", "embeddings", "pooling", "devices", "n_cpu_moe", "kv_overrides", "use_mlock",
          "use_direct_io", "check_tensors", "lora_adapters", "lora_init_without_apply", "control_vectors",
          "control_vector_layer_range", "mmproj", "spec_draft_model", "spec_draft_n_ctx", "spec_draft_n_gpu_layers"]
T2_KEY = ["n_ctx", "n_batch", "n_ubatch", "n_parallel", "kv_unified", "cache_type_k", "cache_type_v", "flash_attn",
          "n_threads", "n_threads_batch", "rope_scaling", "rope_freq_base", "rope_freq_scale", "yarn_ext_factor",
          "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "spec_type", "spec_n_max",
          "spec_n_min", "spec_ngram_size", "spec_p_min"]
T1_KEY = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "n_predict",
          "chat_template", "cache_prompt", "cache_ram_mib", "reasoning_format", "reasoning_budget", "default_template_kwargs",
          "reload_policy", "reload_queue_timeout_s", "text_overlap", "prefill_split", "sleep_idle_seconds", "ctx_shift",
          "n_keep", "n_cache_reuse"]

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "small": {"n_ctx": 2048, "n_batch": 256, "temperature": 0.3},
    "big": {"n_ctx": 16384, "top_k": 20},
}


def registry_defaults(model: str) -> dict[str, Any]:
    return dict(MODEL_DEFAULTS.get(model, {}))


def layers(yaml: dict[str, Any] | None = None, runtime: dict[str, Any] | None = None) -> ParamLayers:
    return ParamLayers(yaml=dict(yaml or {}), runtime=dict(runtime or {}), model_defaults=registry_defaults)


# --------------------------------------------------------------------------- fields


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_has_description_and_tier(name: str) -> None:
    info = RuntimeParams.model_fields[name]
    assert isinstance(info.description, str) and info.description.strip(), name
    assert isinstance(info.json_schema_extra, dict) and "tier" in info.json_schema_extra, name
    tier = RuntimeParams.tier_of(name)
    assert tier in (Tier.T1, Tier.T2, Tier.T3), f"{name} has tier {tier!r}; runtime fields are T1..T3"


def test_tier_appears_in_json_schema() -> None:
    props = RuntimeParams.model_json_schema()["properties"]
    assert set(props) == set(FIELDS)
    for name, prop in props.items():
        assert prop["tier"] == int(RuntimeParams.tier_of(name))
        assert prop["description"]


def test_field_lists_cover_every_field() -> None:
    """The tier lists in this file name every field once, so a new field cannot go untested."""
    assert sorted(T3_KEY + T2_KEY + T1_KEY) == sorted(FIELDS)


@pytest.mark.parametrize("name", T3_KEY)
def test_t3_fields(name: str) -> None:
    assert RuntimeParams.tier_of(name) is Tier.T3


@pytest.mark.parametrize("name", T2_KEY)
def test_t2_fields(name: str) -> None:
    assert RuntimeParams.tier_of(name) is Tier.T2


@pytest.mark.parametrize("name", T1_KEY)
def test_t1_fields(name: str) -> None:
    assert RuntimeParams.tier_of(name) is Tier.T1


def test_t4_names_are_not_runtime_fields() -> None:
    assert not T4_FIELDS & set(FIELDS)
    for name in ("http", "port", "models_dir", "registry", "host", "name", "control_allow_from", "drain_timeout_s"):
        assert name in T4_FIELDS


def test_tier_order_and_actions() -> None:
    assert Tier.NONE < Tier.T1 < Tier.T2 < Tier.T3 < Tier.T4
    assert [t.action for t in Tier] == ["none", "apply", "rebuild_context", "reload_model", "restart"]


def test_defaults_are_valid_and_model_less() -> None:
    p = RuntimeParams()
    assert p.model is None
    assert p.n_gpu_layers == -1
    assert p.n_ctx == 8192 and p.n_parallel == 4


def test_runtime_params_forbid_unknown_and_validate_assignment() -> None:
    with pytest.raises(ValidationError):
        RuntimeParams(bogus=1)  # type: ignore[call-arg]
    p = RuntimeParams()
    with pytest.raises(ValidationError):
        p.n_ctx = -1


@pytest.mark.parametrize("bad", [
    {"n_ctx": -5}, {"n_batch": 0}, {"n_parallel": 0}, {"n_parallel": 257}, {"n_gpu_layers": -2},
    {"top_p": 1.5}, {"min_p": -0.1}, {"temperature": -1}, {"n_predict": -2}, {"cache_type_k": "q3"},
    {"flash_attn": "maybe"}, {"split_mode": "diagonal"}, {"rope_scaling": "cubic"}, {"tensor_split": "half"},
])
def test_invalid_values_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as ei:
        RuntimeParams(**bad)
    msg, names = validation_message(ei.value)
    assert names == list(bad)
    assert msg.startswith(f"{next(iter(bad))}: ")


def test_validation_message_unknown_field_and_prefix() -> None:
    with pytest.raises(ValidationError) as ei:
        RuntimeParams(bogus=1, n_ctx=-1)  # type: ignore[call-arg]
    msg, names = validation_message(ei.value, "cfg.yaml")
    assert msg.startswith("cfg.yaml: ")
    assert sorted(names) == ["bogus", "n_ctx"]
    assert "bogus: unknown field" in msg
    assert "; " in msg


# --------------------------------------------------------------------------- snapshot hash


def test_snapshot_hash_is_short_hex_and_stable() -> None:
    h = RuntimeParams().snapshot_hash()
    assert len(h) == 12 and int(h, 16) >= 0
    assert RuntimeParams().snapshot_hash() == h


@pytest.mark.parametrize("change", [{"n_ctx": 4096}, {"flash_attn": "on"}, {"model": "x"}, {"tensor_split": [0.5, 0.5]},
                                    {"n_gpu_layers": 10}])
def test_snapshot_hash_changes_with_t2_t3(change: dict[str, Any]) -> None:
    assert RuntimeParams(**change).snapshot_hash() != RuntimeParams().snapshot_hash()


@pytest.mark.parametrize("change", [{"temperature": 0.0}, {"top_k": 1}, {"seed": 42}, {"chat_template": "chatml"},
                                    {"cache_prompt": False}])
def test_snapshot_hash_ignores_t1(change: dict[str, Any]) -> None:
    assert RuntimeParams(**change).snapshot_hash() == RuntimeParams().snapshot_hash()
    # ... unless asked to cover T1 too
    assert RuntimeParams(**change).snapshot_hash(Tier.T1) != RuntimeParams().snapshot_hash(Tier.T1)


def test_snapshot_hash_at_t3_ignores_t2() -> None:
    assert RuntimeParams(n_ctx=1024).snapshot_hash(Tier.T3) == RuntimeParams().snapshot_hash(Tier.T3)
    assert RuntimeParams(model="m").snapshot_hash(Tier.T3) != RuntimeParams().snapshot_hash(Tier.T3)


# --------------------------------------------------------------------------- layers


def test_default_layer_only() -> None:
    L = ParamLayers()
    assert L.effective() == RuntimeParams()
    assert all(s["source"] == "default" for s in L.sources().values())


def test_layer_precedence_default_model_yaml_runtime() -> None:
    L = layers(yaml={"model": "small", "n_ctx": 4096}, runtime={"temperature": 1.2})
    eff = L.effective()
    assert eff.model == "small"
    assert eff.n_batch == 256          # model layer beats the default (2048)
    assert eff.n_ctx == 4096           # yaml beats the model layer (2048)
    assert eff.temperature == 1.2      # runtime beats the model layer (0.3)
    assert eff.n_ubatch == 512         # nothing overrides: default
    L.runtime["n_ctx"] = 1024
    assert L.effective().n_ctx == 1024  # runtime beats yaml


def test_model_layer_follows_runtime_model_choice() -> None:
    L = layers(yaml={"model": "small"}, runtime={"model": "big"})
    eff = L.effective()
    assert eff.n_ctx == 16384 and eff.top_k == 20
    assert eff.n_batch == 2048 and eff.temperature == 0.8  # small's defaults no longer apply


def test_model_layer_without_callable_or_model() -> None:
    assert ParamLayers(yaml={"model": "small"}).effective().n_ctx == 8192
    assert layers().effective().n_ctx == 8192  # no model chosen: the callable is not consulted


def test_model_defaults_callable_may_return_none() -> None:
    L = ParamLayers(yaml={"model": "x"}, model_defaults=lambda m: None)
    assert L.effective().model == "x"


def test_sources_report_each_layer() -> None:
    L = layers(yaml={"model": "small", "n_ctx": 4096}, runtime={"temperature": 1.2, "n_parallel": 2})
    src = L.sources()
    assert set(src) == set(FIELDS)
    assert src["model"] == {"value": "small", "source": "yaml", "tier": "T3"}
    assert src["n_ctx"] == {"value": 4096, "source": "yaml", "tier": "T2"}
    assert src["n_batch"] == {"value": 256, "source": "model", "tier": "T2"}
    assert src["temperature"] == {"value": 1.2, "source": "runtime", "tier": "T1"}
    assert src["n_parallel"] == {"value": 2, "source": "runtime", "tier": "T2"}
    assert src["top_k"] == {"value": 40, "source": "default", "tier": "T1"}


def test_sources_runtime_override_equal_to_default_still_runtime() -> None:
    src = layers(runtime={"top_k": 40}).sources()
    assert src["top_k"]["source"] == "runtime"


# --------------------------------------------------------------------------- plans


def test_plan_computes_changed_fields_and_max_tier() -> None:
    L = layers(yaml={"n_ctx": 4096})
    plan = L.plan({"temperature": 0.1, "n_ctx": 2048})
    assert isinstance(plan, ConfigurePlan)
    assert plan.changed == ["n_ctx", "temperature"]  # in field order
    assert plan.tier is Tier.T2
    assert plan.effective.n_ctx == 2048 and plan.effective.temperature == 0.1
    assert plan.runtime == {"temperature": 0.1, "n_ctx": 2048}


@pytest.mark.parametrize(("payload", "tier"), [
    ({"top_p": 0.5}, Tier.T1),
    ({"chat_template": "chatml"}, Tier.T1),
    ({"n_batch": 512}, Tier.T2),
    ({"cache_type_k": "q8_0"}, Tier.T2),
    ({"rope_freq_base": 10000.0}, Tier.T2),
    ({"n_gpu_layers": 0}, Tier.T3),
    ({"tensor_split": [0.6, 0.4]}, Tier.T3),
    ({"model": "other"}, Tier.T3),
    ({"model": "other", "n_ctx": 1, "seed": 3}, Tier.T3),
    ({"n_threads": 3, "top_k": 3}, Tier.T2),
])
def test_plan_tier_is_max_of_changed(payload: dict[str, Any], tier: Tier) -> None:
    plan = layers().plan(payload)
    assert plan.tier is tier
    assert set(plan.changed) == set(payload)


def test_plan_does_not_mutate_layers() -> None:
    L = layers(runtime={"seed": 1})
    before = L.effective()
    L.plan({"seed": 2, "n_ctx": 1024})
    assert L.runtime == {"seed": 1}
    assert L.effective() == before


def test_unchanged_payload_is_tier_none() -> None:
    L = layers(yaml={"n_ctx": 4096})
    for payload in ({}, {"n_ctx": 4096}, {"temperature": 0.8}, {"flash_attn": "auto", "top_k": 40}):
        plan = L.plan(payload)
        assert plan.changed == [] and plan.tier is Tier.NONE, payload
        assert Tier.NONE.action == "none"


def test_model_change_also_reports_fields_from_model_defaults() -> None:
    L = layers(yaml={"model": "small"})
    plan = L.plan({"model": "big"})
    assert plan.tier is Tier.T3
    assert set(plan.changed) == {"model", "n_ctx", "n_batch", "temperature", "top_k"}
    assert plan.effective.n_ctx == 16384 and plan.effective.n_batch == 2048


def test_null_drops_runtime_override_to_lower_layer() -> None:
    L = layers(yaml={"model": "small", "n_ctx": 4096}, runtime={"n_ctx": 1024, "top_k": 5})
    plan = L.plan({"n_ctx": None})
    assert "n_ctx" not in plan.runtime and plan.runtime == {"top_k": 5}
    assert plan.effective.n_ctx == 4096  # back to yaml
    assert plan.changed == ["n_ctx"] and plan.tier is Tier.T2
    L.commit(plan)
    assert L.sources()["n_ctx"]["source"] == "yaml"

    plan = L.plan({"top_k": None})
    assert plan.effective.top_k == 40 and plan.tier is Tier.T1  # back to the default
    L.commit(plan)
    assert L.sources()["top_k"]["source"] == "default"


def test_null_back_to_model_layer() -> None:
    L = layers(yaml={"model": "small"}, runtime={"n_batch": 64})
    plan = L.plan({"n_batch": None})
    assert plan.effective.n_batch == 256
    L.commit(plan)
    assert L.sources()["n_batch"]["source"] == "model"


def test_null_for_field_without_override_is_noop() -> None:
    plan = layers(yaml={"n_ctx": 4096}).plan({"n_ctx": None, "seed": None})
    assert plan.runtime == {} and plan.changed == [] and plan.tier is Tier.NONE


def test_null_model_means_no_model() -> None:
    """``model`` is the exception: null is a value (unload), not 'drop the override'."""
    L = layers(yaml={"model": "small"})
    plan = L.plan({"model": None})
    assert plan.runtime == {"model": None}
    assert plan.effective.model is None
    assert plan.effective.n_batch == 2048  # the model layer goes with the model
    assert plan.tier is Tier.T3
    L.commit(plan)
    assert L.sources()["model"] == {"value": None, "source": "runtime", "tier": "T3"}


@pytest.mark.parametrize("payload", [{"http": {"port": 1}}, {"port": 8081}, {"models_dir": "/x"},
                                     {"registry": "r.yaml"}, {"name": "e"}, {"drain_timeout_s": 1}])
def test_t4_names_need_restart(payload: dict[str, Any]) -> None:
    with pytest.raises(ParamError) as ei:
        layers().plan(payload)
    assert ei.value.code == "restart_required"
    assert ei.value.fields == list(payload)
    assert list(payload)[0] in str(ei.value)
    assert "restart" in str(ei.value)


def test_t4_names_listed_sorted_and_win_over_other_errors() -> None:
    with pytest.raises(ParamError) as ei:
        layers().plan({"port": 1, "http": {}, "bogus": 1, "n_ctx": -1, "temperature": 0.5})
    assert ei.value.code == "restart_required"
    assert ei.value.fields == ["http", "port"]
    assert "http, port" in str(ei.value)


def test_unknown_fields() -> None:
    with pytest.raises(ParamError) as ei:
        layers().plan({"zeta": 1, "alpha": 2, "n_ctx": 1024})
    assert ei.value.code == "unknown_param"
    assert ei.value.fields == ["alpha", "zeta"]
    assert "alpha" in str(ei.value) and "zeta" in str(ei.value)


@pytest.mark.parametrize(("payload", "field"), [
    ({"n_ctx": -5}, "n_ctx"),
    ({"flash_attn": "maybe"}, "flash_attn"),
    ({"top_p": 2}, "top_p"),
    ({"cache_type_v": "q2_k"}, "cache_type_v"),
    ({"n_parallel": 0, "temperature": 0.1}, "n_parallel"),
    ({"tensor_split": ["a"]}, "tensor_split.0"),
])
def test_invalid_value_names_field(payload: dict[str, Any], field: str) -> None:
    L = layers()
    with pytest.raises(ParamError) as ei:
        L.plan(payload)
    assert ei.value.code == "invalid_param"
    assert ei.value.fields == [field]
    assert str(ei.value).startswith(f"{field}: ")
    assert L.runtime == {}


def test_invalid_model_defaults_surface_as_param_error() -> None:
    L = ParamLayers(model_defaults=lambda m: {"n_ctx": -1} if m == "broken" else {})
    with pytest.raises(ParamError) as ei:
        L.plan({"model": "broken"})
    assert ei.value.fields == ["n_ctx"]


@pytest.mark.parametrize("payload", [[1, 2], "n_ctx=1", None, 3])
def test_payload_must_be_object(payload: Any) -> None:
    with pytest.raises(ParamError) as ei:
        layers().plan(payload)
    assert ei.value.code == "invalid_param" and ei.value.fields == []


def test_param_error_is_value_error() -> None:
    err = ParamError("m", ["f"])
    assert isinstance(err, ValueError) and err.code == "invalid_param" and err.fields == ["f"]


def test_commit_makes_plan_the_baseline() -> None:
    L = layers(yaml={"n_ctx": 4096})
    plan = L.plan({"n_ctx": 2048, "top_k": 7})
    L.commit(plan)
    assert L.runtime == {"n_ctx": 2048, "top_k": 7}
    assert L.effective() == plan.effective
    again = L.plan({"n_ctx": 2048, "top_k": 7})
    assert again.changed == [] and again.tier is Tier.NONE
    nxt = L.plan({"top_k": 8})
    assert nxt.changed == ["top_k"] and nxt.tier is Tier.T1
    assert nxt.runtime == {"n_ctx": 2048, "top_k": 8}  # earlier overrides carry over


def test_uncommitted_plan_is_not_the_baseline() -> None:
    L = layers()
    L.plan({"n_ctx": 2048})
    assert L.plan({"n_ctx": 2048}).tier is Tier.T2


def test_snapshot_hash_across_plans() -> None:
    L = layers(yaml={"model": "small"})
    base = L.effective().snapshot_hash()
    t1 = L.plan({"temperature": 0.0, "seed": 5, "top_p": 0.5})
    assert t1.tier is Tier.T1 and t1.effective.snapshot_hash() == base
    t2 = L.plan({"n_ctx": 1024})
    assert t2.tier is Tier.T2 and t2.effective.snapshot_hash() != base
    t3 = L.plan({"n_gpu_layers": 0})
    assert t3.tier is Tier.T3 and t3.effective.snapshot_hash() != base


# --------------------------------------------------------------------------- property

_T1_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.floats(0, 5, allow_nan=False),
    "top_k": st.integers(0, 1000),
    "top_p": st.floats(0, 1, allow_nan=False),
    "min_p": st.floats(0, 1, allow_nan=False),
    "repeat_penalty": st.floats(0, 3, allow_nan=False),
    "repeat_last_n": st.integers(0, 4096),
    "seed": st.integers(-1, 2**31),
    "n_predict": st.integers(-1, 10**6),
    "chat_template": st.one_of(st.sampled_from(["chatml", "llama3", "gemma"]), st.text(min_size=1, max_size=20)),
    "cache_prompt": st.booleans(),
    "cache_ram_mib": st.integers(-1, 1 << 20),
    "reasoning_format": st.sampled_from(["none", "deepseek", "deepseek-legacy"]),
    "reasoning_budget": st.integers(-1, 10**6),
    "default_template_kwargs": st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
        lambda k: k not in ("messages", "tools", "bos_token", "eos_token")), st.one_of(st.booleans(), st.integers(0, 9),
                                                                                   st.text(max_size=5)), max_size=3),
    "reload_policy": st.sampled_from(["auto", "overlap", "drain"]),
    "reload_queue_timeout_s": st.floats(0.1, 600, allow_nan=False),
    "text_overlap": st.sampled_from(["auto", "on", "off"]),
    "prefill_split": st.sampled_from(["ubatch", "batch"]),
    "sleep_idle_seconds": st.one_of(st.just(-1), st.floats(0, 86400, allow_nan=False)),
    "ctx_shift": st.booleans(),
    "n_keep": st.integers(-1, 4096),
    "n_cache_reuse": st.integers(0, 256),
}
assert set(_T1_VALUES) == set(T1_KEY)

_BASES = st.sampled_from([
    {},
    {"model": "small", "n_ctx": 4096},
    {"model": "big", "flash_attn": "on", "temperature": 0.2},
])


@settings(max_examples=200, deadline=None)
@given(yaml=_BASES, payload=st.fixed_dictionaries({}, optional=_T1_VALUES))
def test_any_t1_change_is_tier_t1(yaml: dict[str, Any], payload: dict[str, Any]) -> None:
    L = layers(yaml=yaml)
    old = L.effective()
    plan = L.plan(payload)
    expect_changed = [k for k in FIELDS if k in payload and getattr(old, k) != payload[k]]
    assert plan.changed == expect_changed
    assert plan.tier is (Tier.T1 if expect_changed else Tier.NONE)
    assert plan.effective.snapshot_hash() == old.snapshot_hash()
    for k, v in payload.items():
        assert getattr(plan.effective, k) == v


@settings(max_examples=100, deadline=None)
@given(payload=st.fixed_dictionaries({}, optional=_T1_VALUES))
def test_t1_change_then_null_restores(payload: dict[str, Any]) -> None:
    L = layers(yaml={"model": "small"})
    start = L.effective()
    L.commit(L.plan(payload))
    back = L.plan({k: None for k in payload})
    assert back.effective == start
    assert back.runtime == {}


@pytest.mark.parametrize("payload, field, text", [
    ({"rpc_servers": ["peer"]}, "rpc_servers", "not host:port"),
    ({"rpc_servers": ["10.0.0.2:0"]}, "rpc_servers", "not host:port"),
    ({"rpc_servers": ["10.0.0.2:70000"]}, "rpc_servers", "not host:port"),
    ({"rpc_servers": ["a b:1"]}, "rpc_servers", "not host:port"),
    ({"rpc_servers": [f"h{i}:1" for i in range(9)]}, "rpc_servers", "at most 8"),
    ({"override_tensors": ["exps"]}, "override_tensors", "REGEX=BUFFER_TYPE"),
    ({"override_tensors": ["(exps=CPU"]}, "override_tensors", "bad regular expression"),
    ({"override_tensors": ["exps="]}, "override_tensors", "REGEX=BUFFER_TYPE"),
    ({"tensor_split": [float("nan"), 1.0]}, "tensor_split", "finite"),
    ({"tensor_split": [0.0, 0.0]}, "tensor_split", "not all zero"),
    ({"tensor_split": [-1.0, 2.0]}, "tensor_split", "non-negative"),
])
def test_combine_fields_refuse_what_llama_cpp_could_not_use(payload: dict, field: str, text: str) -> None:
    with pytest.raises(ValidationError) as exc:
        RuntimeParams(**payload)
    err = exc.value.errors()[0]
    assert err["loc"][0] == field and text in str(exc.value)


def test_combine_fields_accept_what_the_docs_show() -> None:
    p = RuntimeParams(rpc_servers=["127.0.0.1:9503", "[::1]:9503"], tensor_split=[0.6, 0.4],
                      override_tensors=[r"\.ffn_(up|down|gate)_exps=RPC", "blk\\.0\\.=CPU"])
    assert p.rpc_servers == ["127.0.0.1:9503", "[::1]:9503"] and len(p.override_tensors or []) == 2
    assert RuntimeParams(rpc_servers=[], override_tensors=[]).rpc_servers is None  # empty = none


def test_embedding_params_default_off_and_take_rank() -> None:
    """Embeddings are opt-in (a second context); rank pooling is a reranker's (/rerank); another is refused."""
    p = RuntimeParams()
    assert p.embeddings is False and p.pooling == "model"
    assert RuntimeParams(embeddings=True, pooling="mean").pooling == "mean"
    assert RuntimeParams(embeddings=True, pooling="rank").pooling == "rank"
    with pytest.raises(ValidationError):
        RuntimeParams(pooling="sum")


def test_sources_follow_every_change_of_the_layers() -> None:
    """sources() is remembered per content of the layers: a change in place or by assignment shows."""
    layers = ParamLayers(yaml={"n_ctx": 2048}, runtime={"temperature": 0.5})
    first = layers.sources()
    assert first["temperature"] == {"value": 0.5, "source": "runtime", "tier": first["temperature"]["tier"]}
    first["temperature"]["value"] = 99  # a caller's copy: the next answer is not touched
    assert layers.sources()["temperature"]["value"] == 0.5
    layers.runtime["temperature"] = 0.7
    assert layers.sources()["temperature"]["value"] == 0.7
    layers.runtime = {}
    assert layers.sources()["temperature"]["source"] != "runtime"
    layers.yaml = {"n_ctx": 4096}
    assert layers.sources()["n_ctx"] == {"value": 4096, "source": "yaml", "tier": layers.sources()["n_ctx"]["tier"]}

"""Profiles: loading the file, errors that name the field, the SOLO/COMBINE/PEER resolver, diffs."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from hydrad.coordinator.profiles import (
    EngineEntry,
    Profile,
    ProfileSet,
    diff_profiles,
    load_profiles,
    resolve,
    resolve_profile,
)
from hydrad.common.registry import Registry

REPO = Path(__file__).resolve().parents[3]
ETC = REPO / "etc" / "hydra"

MODELS: dict[str, Any] = {
    "gemma3-270m": {"n_ctx": 8192},
    "smollm2-135m": {"n_ctx": 4096, "temperature": 0.2},
    "big-model": {"n_ctx": 16384},
    "moe": {},
}
PEER_RPC = {"p100": "192.168.10.3:9505", "5060ti": "192.168.10.1:9503"}

BRIEF_EXAMPLE = """\
profiles:
  dense:
    engines:
      5060ti: {model: gemma3-270m, mode: SOLO}
      3060:  {model: smollm2-135m, mode: SOLO}
  combine:
    engines:
      5060ti: {model: big-model, mode: COMBINE, peer: p100, tensor_split: [0.6, 0.4]}
      p100: {mode: PEER}          # no model: its device serves the head's layers over ggml-RPC
default: dense
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "profiles.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def load_error(tmp_path: Path, text: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ValueError) as ei:
        load_profiles(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: "), msg
    return msg


# --------------------------------------------------------------------------- loading


def test_load_example_with_unquoted_numeric_engine_name(tmp_path: Path) -> None:
    ps = load_profiles(write(tmp_path, BRIEF_EXAMPLE))
    assert set(ps.profiles) == {"dense", "combine"}
    assert ps.default == "dense" and ps.default_name == "dense"
    dense = ps.get("dense")
    assert set(dense.engines) == {"5060ti", "3060"}
    assert dense.engines["3060"] == EngineEntry(model="smollm2-135m", mode="SOLO")
    combine = ps.get("combine").engines
    assert combine["5060ti"].tensor_split == (0.6, 0.4)
    assert combine["p100"].mode == "PEER" and combine["p100"].model is None


def test_default_falls_back_to_first_profile(tmp_path: Path) -> None:
    ps = load_profiles(write(tmp_path, "profiles:\n  b: {engines: {}}\n  a: {engines: {}}\n"))
    assert ps.default is None and ps.default_name == "b"
    assert load_profiles(write(tmp_path, "")).default_name is None


def test_get_unknown_profile_lists_known() -> None:
    ps = ProfileSet(profiles={"dense": Profile(), "combine": Profile()})
    with pytest.raises(KeyError, match="unknown profile 'moe' \\(known: combine, dense\\)"):
        ps.get("moe")
    with pytest.raises(KeyError, match="no profiles defined"):
        ProfileSet().get("x")


def test_mode_is_case_insensitive() -> None:
    assert EngineEntry(model="m", mode="solo").mode == "SOLO"  # type: ignore[arg-type]


@pytest.mark.parametrize("path", [ETC / "profiles.yaml", ETC / "dev" / "profiles.yaml"])
def test_shipped_profiles_load_and_name_registered_models(path: Path) -> None:
    ps = load_profiles(path)
    registry = Registry.load(ETC / "models.yaml", ETC)
    assert ps.default_name in ps.profiles
    for profile in ps.profiles.values():
        for entry in profile.engines.values():
            assert entry.model is None or entry.model in registry.entries
        payloads = resolve_profile(profile, registry.entries, PEER_RPC)
        assert all(p["model"] in registry.entries for p in payloads.values())


def test_shipped_seed_and_dev_profiles_have_the_expected_engines() -> None:
    seed = load_profiles(ETC / "profiles.yaml")
    assert set(seed.get(seed.default_name or "").engines) == {"5060ti", "3060", "p100"}
    dev = load_profiles(ETC / "dev" / "profiles.yaml")
    a, b = dev.get("dev").engines, dev.get("swapped").engines
    assert (a["dev-a"].model, a["dev-b"].model) == ("smollm2-135m", "gemma3-270m")
    assert (b["dev-a"].model, b["dev-b"].model) == ("gemma3-270m", "smollm2-135m")
    assert dev.default == "dev"


def test_commented_combine_example_is_valid(tmp_path: Path) -> None:
    text = (ETC / "profiles.yaml").read_text()
    block = text[text.index("  # combine:"):text.index("\ndefault:")]
    uncommented = "\n".join(line.replace("# ", "", 1) for line in block.splitlines() if line.strip())
    ps = load_profiles(write(tmp_path, "profiles:\n" + uncommented + "\n"))
    payloads = resolve_profile(ps.get("combine"), MODELS, PEER_RPC)
    assert payloads["5060ti"]["rpc_servers"] == [PEER_RPC["p100"]]
    assert payloads["p100"] == {"model": None}


@pytest.mark.parametrize("name", ["coordinator.yaml", "dev/coordinator.yaml"])
def test_coordinator_settings_examples(name: str) -> None:
    data = yaml.safe_load((ETC / name).read_text())
    assert set(data) >= {"http", "bus", "events", "heartbeat_interval_s", "liveness", "registry", "profiles",
                         "default_profile"}
    assert data["http"]["port"] == 9000
    assert data["bus"].endswith(":9500") and data["events"].endswith(":9501")
    assert data["heartbeat_interval_s"] == 1.0 and data["liveness"] == 3
    base = (ETC / name).parent
    profiles_path = Path(data["profiles"]) if name == "coordinator.yaml" else base / data["profiles"]
    if name.startswith("dev/"):
        assert data["http"]["host"] == "127.0.0.1" and "127.0.0.1" in data["bus"]
        assert (base / data["registry"]).resolve() == (ETC / "models.yaml").resolve()
        assert data["default_profile"] in load_profiles(profiles_path).profiles
    else:
        assert data["default_profile"] in load_profiles(ETC / "profiles.yaml").profiles


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("profiles: {dense: {engines: {a: {model: m, mode: DUO}}}}", "profiles.dense.engines.a.mode", "SOLO"),
        ("profiles: {dense: {engines: {a: {model: m, colour: red}}}}", "profiles.dense.engines.a.colour", "unknown field"),
        ("profiles: {dense: {engines: {a: {mode: SOLO}}}}", "profiles.dense.engines.a.model", "SOLO needs a model"),
        ("profiles: {dense: {engines: {a: {model: m, mode: COMBINE}}}}", "profiles.dense.engines.a.peer",
         "COMBINE needs a peer"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: b}}}}", "profiles.d.engines.a.peer",
         "'b' is not an engine of this profile"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: b}, b: {model: n}}}}",
         "profiles.d.engines.a.peer", "must have mode PEER"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: a}}}}", "profiles.d.engines.a.peer",
         "its own peer"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: p}, b: {model: m, mode: COMBINE, peer: p},"
         " p: {mode: PEER}}}}", "profiles.d.engines.b.peer", "already the peer of 'a'"),
        ("profiles: {d: {engines: {p: {mode: PEER, model: m}}}}", "profiles.d.engines.p.model", "serves no model"),
        ("profiles: {d: {engines: {p: {mode: PEER, params: {n_ctx: 5}}}}}", "profiles.d.engines.p.params",
         "no runtime parameters"),
        ("profiles: {d: {engines: {a: {model: m, peer: p}}}}", "profiles.d.engines.a.peer", "only a COMBINE"),
        ("profiles: {d: {engines: {a: {model: m, tensor_split: [1, 1]}}}}", "profiles.d.engines.a.tensor_split",
         "only a COMBINE"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: p, tensor_split: [1, 1, 1]}, p: {mode: PEER}}}}",
         "profiles.d.engines.a.tensor_split", "at most 2"),
        ("profiles: {d: {engines: {a: {model: m, mode: COMBINE, peer: p, tensor_split: [0, 0]}, p: {mode: PEER}}}}",
         "profiles.d.engines.a.tensor_split", "not all zero"),
        ("profiles: {d: {engines: {a: {model: m, override_tensors: [exps]}}}}", "profiles.d.engines.a.override_tensors",
         "is not REGEX=BUFFER_TYPE"),
        ("profiles: {d: {engines: {a: {model: m, override_tensors: ['(=CPU']}}}}",
         "profiles.d.engines.a.override_tensors", "bad regular expression"),
        ("profiles: {d: {engines: {a: {model: m, override_tensors: ['exps=RPC0']}}}}",
         "profiles.d.engines.a.override_tensors", "no RPC device"),
        ("profiles: {d: {engines: {a: {model: m, params: {n_ctx: -1}}}}}", "profiles.d.engines.a.params", "n_ctx"),
        ("profiles: {d: {engines: {a: {model: m, params: {bogus: 1}}}}}", "profiles.d.engines.a.params", "bogus"),
        ("profiles: {d: {engines: {a: {model: m, params: {tensor_split: [1]}}}}}", "profiles.d.engines.a.params",
         "set by the entry's model/mode"),
        ("profiles: {d: {engines: {'bad name': {model: m}}}}", "profiles.d.engines", "bad engine name"),
        ("profiles: {d: {engines: {yes: {model: m}}}}", "profiles.d.engines", "quote keys"),
        ("profiles: {d: {engines: {}}}\ndefault: e", "default", "'e' is not a profile (known: d)"),
        ("profiles: {d: {engines: {}}}\nextra: 1", "extra", "unknown field"),
        ("profiles: {d: {engines: {}, colour: red}}", "profiles.d.colour", "unknown field"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    msg = load_error(tmp_path, text)
    assert f": {field}: " in msg, msg
    assert words in msg, msg


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ValueError, match="cannot read"):
        load_profiles(missing)
    assert "not valid YAML at line" in load_error(tmp_path, "profiles: [\n")
    assert "top level must be a mapping" in load_error(tmp_path, "- a\n- b\n")
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"profiles: {}\n# \xff\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_profiles(bad)


def test_entries_built_in_code_are_validated_too() -> None:
    with pytest.raises(ValidationError):
        EngineEntry(mode="COMBINE", model="m")


# --------------------------------------------------------------------------- resolver


def test_solo_payload() -> None:
    p = resolve(EngineEntry(model="smollm2-135m", mode="SOLO"), MODELS, PEER_RPC)
    # registry defaults stay out: the engine layers them below its own YAML; so does the engine's offload
    # (a CPU host's n_gpu_layers: 0 must not be overridden into a reload)
    assert p == {"model": "smollm2-135m", "tensor_split": None, "rpc_servers": None, "override_tensors": None}


def test_solo_takes_registry_entries_and_params() -> None:
    registry = Registry.load(ETC / "models.yaml", ETC)
    entry = EngineEntry(model="gemma3-270m", params={"n_ctx": 32768, "n_parallel": 8, "n_gpu_layers": 20})
    p = resolve(entry, registry.entries, {})
    assert p["n_ctx"] == 32768 and p["n_parallel"] == 8 and p["n_gpu_layers"] == 20
    assert p["model"] == "gemma3-270m"


def test_solo_may_keep_experts_on_cpu() -> None:
    entry = EngineEntry(model="moe", override_tensors=("blk\\..*\\.ffn_.*_exps\\..*=CPU",))
    assert resolve(entry, MODELS, {})["override_tensors"] == ["blk\\..*\\.ffn_.*_exps\\..*=CPU"]


def test_combine_payload_layer_split() -> None:
    entry = EngineEntry(model="big-model", mode="COMBINE", peer="p100", tensor_split=(0.6, 0.4))
    p = resolve(entry, MODELS, PEER_RPC)
    assert p == {"model": "big-model", "n_gpu_layers": -1, "split_mode": "layer",
                 "tensor_split": [0.6, 0.4], "rpc_servers": ["192.168.10.3:9505"], "override_tensors": None}


def test_combine_default_split_is_even() -> None:
    p = resolve(EngineEntry(model="big-model", mode="COMBINE", peer="p100"), MODELS, PEER_RPC)
    assert p["tensor_split"] == [0.5, 0.5]


def test_combine_moe_expert_split_is_only_override_tensors() -> None:
    ot = "blk\\..*\\.ffn_.*_exps\\..*=RPC0"
    p = resolve(EngineEntry(model="moe", mode="COMBINE", peer="p100", override_tensors=(ot,)), MODELS, PEER_RPC)
    assert p["override_tensors"] == [ot]
    assert p["split_mode"] == "layer" and p["n_gpu_layers"] == -1 and p["rpc_servers"] == ["192.168.10.3:9505"]
    assert p["tensor_split"] == [1.0, 0.0]  # the layers stay on the head; the overrides move the experts
    assert set(p) == {"model", "n_gpu_layers", "split_mode", "tensor_split", "rpc_servers", "override_tensors"}


def test_combine_without_peer_address_names_the_peer() -> None:
    with pytest.raises(ValueError, match="no RPC address known for peer 'p100' \\(known: none\\)"):
        resolve(EngineEntry(model="big-model", mode="COMBINE", peer="p100"), MODELS, {})


def test_peer_payload() -> None:
    assert resolve(EngineEntry(mode="PEER"), MODELS, PEER_RPC) == {"model": None}


def test_unknown_model_is_an_error_but_a_gguf_path_is_not() -> None:
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        resolve(EngineEntry(model="nope"), MODELS, {})
    p = resolve(EngineEntry(model="/srv/models/x.gguf"), MODELS, {})
    assert p["model"] == "/srv/models/x.gguf" and "n_ctx" not in p


def test_every_resolved_payload_is_a_valid_engine_payload() -> None:
    """What the switcher sends (COMBINE's peer fields included) is what the engine accepts."""
    from hydrad.common.params import RuntimeParams

    for entry in (EngineEntry(model="smollm2-135m"), EngineEntry(model="big-model", mode="COMBINE", peer="p100"),
                  EngineEntry(model="moe", mode="COMBINE", peer="p100", override_tensors=("exps=RPC0",))):
        RuntimeParams(**resolve(entry, MODELS, PEER_RPC))


# --------------------------------------------------------------------------- diff


def test_diff_keeps_only_changed_engines(tmp_path: Path) -> None:
    ps = load_profiles(write(tmp_path, BRIEF_EXAMPLE))
    dense = resolve_profile(ps.get("dense"), MODELS, PEER_RPC)
    combine = resolve_profile(ps.get("combine"), MODELS, PEER_RPC)
    assert diff_profiles(dense, dense) == {}
    changed = diff_profiles(dense, combine)
    assert set(changed) == {"5060ti", "p100"}  # p100 was not in dense: it gets its PEER payload
    assert changed["p100"] == {"model": None}
    back = diff_profiles({**dense, **combine}, dense)
    assert set(back) == {"5060ti"} and back["5060ti"]["rpc_servers"] is None


def test_diff_compares_only_target_keys_and_ignores_list_vs_tuple() -> None:
    target = {"a": {"model": "m", "tensor_split": [0.5, 0.5]}}
    effective = {"a": {"model": "m", "tensor_split": (0.5, 0.5), "n_ctx": 4096, "top_k": 40}}
    assert diff_profiles(effective, target) == {}
    assert diff_profiles({"a": {"model": "m"}}, target) == target  # a missing key is a change
    assert diff_profiles({"a": {"model": "m", "tensor_split": [0.6, 0.4]}}, target) == target


def test_diff_leaves_engines_outside_the_target_alone() -> None:
    assert diff_profiles({"a": {"model": "m"}, "b": {"model": "n"}}, {"a": {"model": "x"}}) == {"a": {"model": "x"}}

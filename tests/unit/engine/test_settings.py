"""Start-only settings: load_config, its error messages, path resolution, control ACL, CLI checks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pydantic import BaseModel

from hydrad.engine.settings import ConfigError, EngineSettings, LoadedConfig, load_config

REPO = Path(__file__).resolve().parents[3]
ETC = REPO / "etc" / "hydra"
EXAMPLES = [ETC / "5060ti.yaml", ETC / "3060.yaml", ETC / "p100.yaml", ETC / "dev" / "engine.yaml"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    return str(ei.value)


GOOD = """\
    name: gpu0
    http:
      host: 0.0.0.0
      port: 8085
    rpc:
      port: 9600
    models_dir: /srv/models
    registry: /srv/models.yaml
    control_allow_from: [10.1.0.0/16, "fd00::/8"]
    drain_timeout_s: 12.5
    max_queue: 3
    switch_interval_ms: 0.2
    reaper: {delay_ms: 0, pause_ms: 50}
    logging:
      level: debug
      llama_level: error
    defaults:
      model: smollm2-135m
      n_ctx: 4096
      flash_attn: "on"
"""


# --------------------------------------------------------------------------- good files


def test_load_good_config(tmp_path: Path) -> None:
    path = write(tmp_path / "gpu0.yaml", GOOD)
    loaded = load_config(path)
    assert isinstance(loaded, LoadedConfig)
    s = loaded.settings
    assert loaded.path == path
    assert s.name == "gpu0"
    assert (s.http.host, s.http.port) == ("0.0.0.0", 8085)
    assert (s.rpc.host, s.rpc.port) == ("127.0.0.1", 9600)
    assert s.models_dir == Path("/srv/models")
    assert s.registry == Path("/srv/models.yaml")
    assert s.control_allow_from == ["10.1.0.0/16", "fd00::/8"]
    assert s.drain_timeout_s == 12.5 and s.max_queue == 3
    assert s.switch_interval_ms == 0.2 and (s.reaper.delay_ms, s.reaper.pause_ms) == (0, 50)
    assert (s.logging.level, s.logging.llama_level) == ("debug", "error")
    assert s.defaults == {"model": "smollm2-135m", "n_ctx": 4096, "flash_attn": "on"}
    assert loaded.raw["http"] == {"host": "0.0.0.0", "port": 8085}


def test_no_path_gives_defaults() -> None:
    loaded = load_config(None)
    assert loaded.path is None and loaded.raw == {}
    s = loaded.settings
    assert s == EngineSettings()
    assert s.name == "engine" and s.http.port == 8080 and s.rpc.port == 9503
    assert s.models_dir == Path("/var/lib/hydra/models") and s.registry is None
    assert s.defaults == {}


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path / "e.yaml", "# nothing here\n"))
    assert loaded.raw == {}
    assert loaded.settings.name == "engine"
    assert loaded.settings.registry is None  # no models.yaml beside it


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(ETC).as_posix())
def test_example_configs_load(path: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    if (raw.get("rpc") or {}).get("token_file"):  # the production examples name /etc/hydra/engine.token
        assert raw["rpc"]["token_file"] == "/etc/hydra/engine.token"
        assert "token_file" in path.read_text() and "install -m 600" in path.read_text()  # with how to make it
        token = tmp_path / "engine.token"
        token.write_text("an-example-token-of-the-right-length\n")
        raw["rpc"]["token_file"] = str(token)
        if not Path(raw["models_dir"]).is_absolute():
            raw["models_dir"] = str((path.parent / raw["models_dir"]).resolve())
        path = tmp_path / path.name
        path.write_text(yaml.safe_dump(raw))
    loaded = load_config(path)
    assert loaded.settings.defaults  # each example sets runtime defaults
    assert loaded.settings.models_dir.is_absolute()


def test_rpc_token_file(tmp_path: Path) -> None:
    (tmp_path / "engine.token").write_text("  0123456789abcdef-token  \n")
    cfg = write(tmp_path / "e.yaml", """\
        rpc:
          token_file: engine.token
        """)
    loaded = load_config(cfg)
    assert loaded.settings.rpc.token == "0123456789abcdef-token"  # relative to the config, whitespace stripped
    assert loaded.settings.token_ok("0123456789abcdef-token") and not loaded.settings.token_ok("0123456789abcdef")
    assert "0123456789abcdef-token" not in json.dumps(loaded.sources())  # --print-config never shows it
    assert loaded.sources()["rpc.token"]["value"] == "(set)"
    assert EngineSettings().token_ok(None)  # no token configured: nothing to prove

    missing = write(tmp_path / "m.yaml", "rpc:\n  token_file: /nonexistent/engine.token\n")
    msg = config_error(missing)
    assert msg.startswith(str(missing)) and "rpc.token_file" in msg and "does not exist" in msg
    (tmp_path / "short.token").write_text("short\n")
    msg = config_error(write(tmp_path / "s.yaml", "rpc:\n  token_file: short.token\n"))
    assert "rpc.token_file" in msg and "16" in msg
    msg = config_error(write(tmp_path / "b.yaml", "rpc:\n  token: abcdefghijklmnopq\n  token_file: engine.token\n"))
    assert "rpc" in msg and "not both" in msg


def test_dev_example_resolves_into_repo() -> None:
    s = load_config(ETC / "dev" / "engine.yaml").settings
    assert s.name == "dev"
    assert s.models_dir == (REPO / "models").resolve()
    assert s.registry == (ETC / "models.yaml").resolve()


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    msg = config_error(path)
    assert str(path) in msg and "cannot read" in msg


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    msg = config_error(tmp_path)
    assert str(tmp_path) in msg and "cannot read" in msg


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", """\
        name: dev
        http:
          port: 8080
           host: x
        """)
    msg = config_error(path)
    assert msg.startswith(f"{path}: not valid YAML")
    assert "line 4" in msg


def test_unterminated_flow_sequence_names_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "name: dev\nhttp:\n  port: [1, 2\nrpc:\n  port: 1\n")
    msg = config_error(path)
    assert str(path) in msg and "not valid YAML at line " in msg


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_mapping(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "c.yaml", text)
    msg = config_error(path)
    assert str(path) in msg and "top level must be a mapping" in msg


def test_wrong_type_names_file_and_dotted_field(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", 'http: {port: "abc"}\n')
    msg = config_error(path)
    assert msg.startswith(f"{path}: ")
    assert "http.port" in msg


@pytest.mark.parametrize(("text", "field"), [
    ("http: {port: 70000}\n", "http.port"),
    ("rpc: {port: -1}\n", "rpc.port"),
    ("http: {hots: x}\n", "http.hots"),
    ("logging: {level: loud}\n", "logging.level"),
    ("logging: {slow_loop_ms: 0.5}\n", "logging.slow_loop_ms"),  # a check every 0.5 ms would busy the loop
    ("logging: {slow_loop_ms: -1}\n", "logging.slow_loop_ms"),
    ("name: 'has space'\n", "name"),
    ("name: 3060\n", "name"),  # unquoted: an int, not a name
    ("drain_timeout_s: 0\n", "drain_timeout_s"),
    ("switch_interval_ms: 0\n", "switch_interval_ms"),
    ("switch_interval_ms: 500\n", "switch_interval_ms"),
    ("reaper: {delay_ms: -1}\n", "reaper.delay_ms"),
    ("reaper: {pause_ms: 1e9}\n", "reaper.pause_ms"),
    ("reaper: {pace: 3}\n", "reaper.pace"),
    ("max_queue: -1\n", "max_queue"),
    ("models_dir: [a]\n", "models_dir"),
])
def test_invalid_fields_named(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path / "c.yaml", text)
    msg = config_error(path)
    assert str(path) in msg and f"{field}:" in msg


def test_unknown_top_level_key_named(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "name: ok\nmodel_dir: /x\n")
    msg = config_error(path)
    assert str(path) in msg
    assert "model_dir: unknown field" in msg


def test_several_errors_all_named(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "bogus: 1\nhttp: {port: x}\n")
    msg = config_error(path)
    assert "bogus" in msg and "http.port" in msg


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "not-a-net", "300.1.1.1/8", "::1/129"])
def test_bad_cidr_named(tmp_path: Path, cidr: str) -> None:
    path = write(tmp_path / "c.yaml", f'control_allow_from: ["127.0.0.0/8", "{cidr}"]\n')
    msg = config_error(path)
    assert str(path) in msg and "control_allow_from" in msg and cidr in msg


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "not-a-net"])
def test_bad_direct_line_network_named(tmp_path: Path, cidr: str) -> None:
    path = write(tmp_path / "c.yaml", f'rpc: {{ggml_direct_from: ["127.0.0.0/8", "{cidr}"]}}\n')
    msg = config_error(path)
    assert "rpc.ggml_direct_from" in msg and cidr in msg


def test_cidr_with_host_bits_is_accepted(tmp_path: Path) -> None:
    s = load_config(write(tmp_path / "c.yaml", 'control_allow_from: ["192.168.1.7/24"]\n')).settings
    assert s.allows_control("192.168.1.200")


@pytest.mark.parametrize(("defaults", "field"), [
    ("{n_ctx: -1}", "n_ctx"),
    ("{flash_attn: maybe}", "flash_attn"),
    ("{flash_attn: on}", "flash_attn"),  # YAML 1.1: unquoted on is a boolean
    ("{port: 8080}", "port"),
    ("{tempreature: 0.5}", "tempreature"),
])
def test_bad_runtime_default_names_defaults_and_field(tmp_path: Path, defaults: str, field: str) -> None:
    path = write(tmp_path / "c.yaml", f"defaults: {defaults}\n")
    msg = config_error(path)
    assert str(path) in msg and "defaults" in msg and field in msg


def test_defaults_must_be_mapping(tmp_path: Path) -> None:
    msg = config_error(write(tmp_path / "c.yaml", "defaults: [n_ctx]\n"))
    assert "defaults" in msg


def test_non_utf8_file_is_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    msg = config_error(path)
    assert str(path) in msg


@pytest.mark.parametrize("text", ["name: x\n1: foo\n", "on: true\n"])
def test_non_string_top_level_key_is_config_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "c.yaml", text)
    msg = config_error(path)
    assert str(path) in msg


# --------------------------------------------------------------------------- paths


def test_relative_paths_resolve_against_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "etc" / "engine.yaml", "models_dir: ../models\nregistry: reg/models.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = load_config(cfg).settings
    assert s.models_dir == (tmp_path / "models").resolve()
    assert s.registry == (tmp_path / "etc" / "reg" / "models.yaml").resolve()


def test_relative_config_path_resolves_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "etc" / "engine.yaml", "models_dir: m\n")
    monkeypatch.chdir(tmp_path)
    s = load_config("etc/engine.yaml").settings
    assert s.models_dir == (tmp_path / "etc" / "m").resolve()
    assert s.models_dir.is_absolute()


def test_absolute_paths_kept(tmp_path: Path) -> None:
    s = load_config(write(tmp_path / "c.yaml", "models_dir: /opt/m\nregistry: /opt/r.yaml\n")).settings
    assert s.models_dir == Path("/opt/m") and s.registry == Path("/opt/r.yaml")


def test_registry_defaults_to_models_yaml_beside_config(tmp_path: Path) -> None:
    cfg = write(tmp_path / "engine.yaml", "name: a\n")
    assert load_config(cfg).settings.registry is None
    (tmp_path / "models.yaml").write_text("models: {}\n")
    reg = load_config(cfg).settings.registry
    assert reg is not None and reg.resolve() == (tmp_path / "models.yaml").resolve()


def test_explicit_registry_wins_over_sibling(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text("models: {}\n")
    cfg = write(tmp_path / "engine.yaml", "registry: other.yaml\n")
    assert load_config(cfg).settings.registry == (tmp_path / "other.yaml").resolve()


# --------------------------------------------------------------------------- control ACL


@pytest.mark.parametrize(("host", "allowed"), [
    ("127.0.0.1", True),
    ("127.8.9.10", True),
    ("::1", True),
    ("10.0.0.1", False),
    ("192.168.10.5", False),
    ("8.8.8.8", False),
    ("2001:db8::1", False),
    ("garbage", False),
    ("localhost", False),
    ("", False),
    ("127.0.0.1:8080", False),
    (None, False),
])
def test_allows_control_default_networks(host: str | None, allowed: bool) -> None:
    assert EngineSettings().allows_control(host) is allowed


def test_allows_control_configured_networks() -> None:
    s = EngineSettings(control_allow_from=["192.168.10.0/24", "fd00::/8"])
    assert s.allows_control("192.168.10.77")
    assert s.allows_control("fd12::3")
    assert not s.allows_control("192.168.11.1")
    assert not s.allows_control("127.0.0.1")  # loopback only when listed


def test_allows_control_empty_list_denies_all() -> None:
    s = EngineSettings(control_allow_from=[])
    assert not s.allows_control("127.0.0.1") and not s.allows_control("::1")


def test_allows_control_ipv4_mapped_loopback() -> None:
    assert EngineSettings().allows_control("::ffff:127.0.0.1")


# --------------------------------------------------------------------------- sources


def test_sources_yaml_vs_default(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", """\
        name: gpu1
        http: {port: 9000}
        models_dir: models
        defaults: {n_ctx: 1024}
        """)
    src = load_config(cfg).sources()
    assert src["name"] == {"value": "gpu1", "source": "yaml"}
    assert src["http.port"] == {"value": 9000, "source": "yaml"}
    assert src["http.host"] == {"value": "127.0.0.1", "source": "default"}
    assert src["rpc.port"] == {"value": 9503, "source": "default"}
    assert src["logging.level"] == {"value": "info", "source": "default"}
    assert src["models_dir"] == {"value": str((tmp_path / "models").resolve()), "source": "yaml"}
    assert src["drain_timeout_s"]["source"] == "default"
    assert src["control_allow_from"] == {"value": ["127.0.0.0/8", "::1/128"], "source": "default"}
    assert "defaults" not in src
    assert not any(k.startswith("defaults") for k in src)


def test_sources_of_default_config_are_all_default() -> None:
    src = load_config(None).sources()
    assert src and all(v["source"] == "default" for v in src.values())
    expected: set[str] = set()
    for name, info in EngineSettings.model_fields.items():
        if name == "defaults":
            continue
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            expected |= {f"{name}.{f}" for f in sub.model_fields}
        else:
            expected.add(name)
    assert {"http.port", "rpc.port", "logging.level", "models_dir", "control_allow_from"} <= expected
    assert expected == set(src)


# --------------------------------------------------------------------------- the CLI, as a real process


def hydrad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_check_config_bad_file_fails_naming_file_and_field(tmp_path: Path) -> None:
    bad = write(tmp_path / "broken-engine.yaml", 'name: x\nhttp: {port: "abc"}\n')
    r = hydrad("--check-config", str(bad))
    assert r.returncode != 0
    assert "broken-engine.yaml" in r.stderr
    assert "http.port" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_config_bad_default_fails(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad-defaults.yaml", "defaults: {n_ctx: -1}\n")
    r = hydrad("--check-config", str(bad))
    assert r.returncode != 0
    assert "bad-defaults.yaml" in r.stderr and "n_ctx" in r.stderr


def test_check_config_dev_example_ok() -> None:
    r = hydrad("--check-config", "etc/hydra/dev/engine.yaml")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_print_config_dev_example() -> None:
    r = hydrad("--print-config", "etc/hydra/dev/engine.yaml")
    assert r.returncode == 0, r.stderr
    assert "source: yaml" in r.stdout
    out = yaml.safe_load(r.stdout)
    assert out["settings"]["name"] == {"value": "dev", "source": "yaml"}
    assert out["settings"]["rpc.host"]["source"] == "default"
    assert out["params"]["n_ctx"] == {"value": 8192, "source": "yaml", "tier": "T2"}
    assert out["params"]["model"] == {"value": "smollm2-135m", "source": "yaml", "tier": "T3"}
    assert out["params"]["temperature"]["source"] == "default"


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.parent == ETC], ids=lambda p: p.name)
def test_production_engine_examples_join_the_coordinator(path: Path) -> None:
    """Every shipped engine config joins the pool: a bus endpoint and the pool's token file. (None
    had a bus section, so engines installed from them never registered.)"""
    raw = yaml.safe_load(path.read_text())
    bus = raw.get("bus") or {}
    assert bus.get("endpoint", "").startswith("tcp://"), path
    assert bus.get("token_file") == "/etc/hydra/bus.token", path

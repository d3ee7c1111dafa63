"""``hydractl up``'s planning: which configs run, which ports they take, and the moved copies."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from hydrad.cli.common import CliError
from hydrad.cli import up_plan
from hydrad.cli.up import banner
from hydrad.cli.up_plan import EXIT_BAD_CONFIG, console_command, plan

REPO = Path(__file__).resolve().parents[3]
DEV = REPO / "etc" / "hydra" / "dev"


def test_the_shipped_dev_pool_runs_as_is(tmp_path: Path) -> None:
    p = plan(DEV, None, 0, tmp_path)
    assert not p.copies and list(tmp_path.iterdir()) == []
    assert p.profile == "dev" and p.profiles == ["dev", "swapped"]
    assert p.targets == {"dev-a": "smollm2-135m", "dev-b": "gemma3-270m"}
    assert p.coordinator_config == DEV / "coordinator.yaml"
    assert p.engine_configs == {"dev-a": DEV / "dev-a.yaml", "dev-b": DEV / "dev-b.yaml"}
    assert p.http_url == "http://127.0.0.1:9000"
    assert p.engine_urls["dev-a"] == "http://127.0.0.1:8081"
    what = {port.what: port.port for port in p.ports}
    assert what["coordinator HTTP"] == 9000 and what["coordinator bus"] == 9500 and what["dev-a HTTP"] == 8081
    assert what["dev-a RPC"] == 9504


def test_a_port_offset_moves_every_port_into_copies(tmp_path: Path) -> None:
    before = plan(DEV, None, 0, tmp_path / "unused")
    p = plan(DEV, None, 100, tmp_path)
    assert p.copies
    assert [(q.what, q.port) for q in p.ports] == [(q.what, q.port + 100 if q.port else 0) for q in before.ports]
    assert p.coordinator_config == tmp_path / "coordinator.yaml"
    coord = yaml.safe_load(p.coordinator_config.read_text())
    assert coord["http"]["port"] == 9100 and coord["bus"].endswith(":9600") and coord["events"].endswith(":9601")
    engine = yaml.safe_load(p.engine_configs["dev-a"].read_text())
    assert engine["http"]["port"] == 8181 and engine["bus"]["endpoint"].endswith(":9600")
    assert Path(engine["models_dir"]).resolve() == (REPO / "models").resolve()  # still the same models
    assert p.http_url == "http://127.0.0.1:9100"


def test_an_explicit_request_stream_is_a_port_of_the_pool_and_moves_with_the_offset(tmp_path: Path) -> None:
    """The default stream (the bus's port + 2) follows the bus by itself; one the config names is
    checked like the other ports and moved in the copies, or two pools would share it."""
    conf = tmp_path / "conf"
    shutil.copytree(DEV, conf)
    raw = yaml.safe_load((conf / "coordinator.yaml").read_text())
    for key in ("registry", "profiles"):
        raw[key] = str((DEV / raw[key]).resolve())
    raw["bus"] = {"endpoint": raw["bus"], "request_stream": "127.0.0.1:9700"}
    (conf / "coordinator.yaml").write_text(yaml.safe_dump(raw))
    for d in "abc":
        (tmp_path / d).mkdir()
    assert {q.what: q.port for q in plan(conf, None, 0, tmp_path / "a").ports}["coordinator request stream"] == 9700
    p = plan(conf, None, 100, tmp_path / "b")
    assert {q.what: q.port for q in p.ports}["coordinator request stream"] == 9800
    assert yaml.safe_load(p.coordinator_config.read_text())["bus"]["request_stream"] == "127.0.0.1:9800"
    assert "coordinator request stream" not in {q.what for q in plan(DEV, None, 0, tmp_path / "c").ports}


def test_another_profile_is_written_as_the_default_of_a_copy(tmp_path: Path) -> None:
    p = plan(DEV, "swapped", 0, tmp_path)
    assert p.copies and p.profile == "swapped"
    assert p.targets == {"dev-a": "gemma3-270m", "dev-b": "smollm2-135m"}
    assert yaml.safe_load(p.coordinator_config.read_text())["default_profile"] == "swapped"


def test_an_unknown_profile_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(CliError) as err:
        plan(DEV, "nope", 0, tmp_path)
    assert err.value.code == EXIT_BAD_CONFIG and "nope" in str(err.value)


def test_a_directory_without_a_coordinator_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(CliError) as err:
        plan(tmp_path, None, 0, tmp_path)
    assert err.value.code == EXIT_BAD_CONFIG and "coordinator.yaml" in str(err.value)


def test_an_engine_named_by_the_profiles_needs_a_config(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    shutil.copytree(DEV, pool)
    (pool / "dev-b.yaml").unlink()
    coord = yaml.safe_load((pool / "coordinator.yaml").read_text())
    coord["registry"] = str(DEV.parent / "models.yaml")
    (pool / "coordinator.yaml").write_text(yaml.safe_dump(coord))
    with pytest.raises(CliError) as err:
        plan(pool, None, 0, tmp_path / "run")
    assert err.value.code == EXIT_BAD_CONFIG and "dev-b" in str(err.value)


def test_the_console_command_of_the_shipped_pool_needs_no_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dev pool's ports are the console's defaults: the banner names the bare command."""
    monkeypatch.setattr(up_plan.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    p = plan(DEV, None, 0, tmp_path)
    assert p.events_url == "tcp://127.0.0.1:9501" and p.curve_server_key is None
    assert console_command(p) == "hydra-console"
    text = banner(p, 1.0, None)
    assert "\n  hydra-console\n" in text
    assert "curl -i http://127.0.0.1:9000/v1/chat/completions" in text


def test_a_port_offset_gives_the_console_its_admin_url_and_event_endpoint(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--port-offset 1000: the console must be told both moved addresses, exactly as it parses them."""
    monkeypatch.setattr(up_plan.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    p = plan(DEV, None, 1000, tmp_path)
    command = console_command(p)
    assert command == "hydra-console --admin http://127.0.0.1:10000 --coordinator tcp://127.0.0.1:10501"
    assert f"\n  {command}\n" in banner(p, 1.0, None)
    from tui.app import build_parser

    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.admin, args.coordinator) == (p.http_url, p.events_url)


def test_the_console_command_carries_the_admin_token_file_and_curve_key(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(up_plan.shutil, "which", lambda name: None)
    monkeypatch.setattr(up_plan.sys, "argv", [str(tmp_path / "venv" / "bin" / "hydractl")])
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "hydra-console").write_text("")
    p = plan(DEV, None, 0, tmp_path / "unused")
    p.admin_token_file = tmp_path / "admin token"
    p.curve_server_key = "k" * 40
    assert console_command(p) == (f"HYDRA_ADMIN_TOKEN_FILE='{tmp_path / 'admin token'}' "
                                  f"{tmp_path / 'venv' / 'bin' / 'hydra-console'} --curve-server-key {'k' * 40}")


def test_the_console_defaults_are_the_ones_the_banner_assumes() -> None:
    """hydrad.cli may not import the console (docs/architecture.md), so its defaults are copied: held equal here."""
    from tui import app

    assert (up_plan.CONSOLE_ADMIN, up_plan.CONSOLE_EVENTS) == (app.DEFAULT_ADMIN, app.DEFAULT_EVENTS)

"""``hydrad --check-config``: an engine config that is valid but cannot join its pool is warned
about (stderr, exit 0), as a real process, against real coordinator configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
REGISTRY = REPO / "etc" / "hydra" / "models.yaml"


def hydrad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def engine(tmp: Path, name: str, **extra: object) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "registry": str(REGISTRY), "models_dir": str(tmp), **extra}))
    return path


def coordinator(tmp: Path, *, token: bool = False) -> Path:
    (tmp / "profiles.yaml").write_text(yaml.safe_dump({
        "profiles": {"steady": {"engines": {"gpu0": {"model": "gemma3-270m"}}},
                     "spare": {"engines": {"gpu0": {"model": "smollm2-135m"}, "gpu1": {"model": "gemma3-270m"}}}},
        "default": "steady"}))
    cfg: dict[str, object] = {"bus": "tcp://0.0.0.0:9500", "registry": str(REGISTRY), "profiles": "profiles.yaml"}
    if token:
        cfg["bus_token_file"] = "bus.token"
    path = tmp / "coordinator.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_an_engine_without_a_bus_is_warned_that_it_will_not_join_a_pool(tmp_path: Path) -> None:
    r = hydrad("--check-config", str(engine(tmp_path, "alone")))
    assert r.returncode == 0, r.stderr
    assert "warning" in r.stderr and "no bus endpoint" in r.stderr and "will not join a pool" in r.stderr
    assert "ok (1 warning)" in r.stdout


def test_a_profile_placing_an_engine_without_a_bus_is_named(tmp_path: Path) -> None:
    r = hydrad("--check-config", str(engine(tmp_path, "gpu0")), "--coordinator-config", str(coordinator(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "will not join a pool" in r.stderr and "profiles spare, steady" in r.stderr and "'gpu0'" in r.stderr


def test_an_engine_that_joins_its_coordinator_gets_no_warning(tmp_path: Path) -> None:
    c = coordinator(tmp_path, token=True)
    token = tmp_path / "bus.token"
    cfg = engine(tmp_path, "gpu1", bus={"endpoint": "tcp://10.0.0.5:9500", "token_file": str(token)})
    r = hydrad("--check-config", str(cfg), "--coordinator-config", str(c))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == f"{cfg}: ok"


def test_a_wrong_bus_port_and_a_missing_token_are_warned(tmp_path: Path) -> None:
    c = coordinator(tmp_path, token=True)
    r = hydrad("--check-config", str(engine(tmp_path, "gpu1", bus={"endpoint": "tcp://127.0.0.1:9600"})),
               "--coordinator-config", str(c))
    assert r.returncode == 0, r.stderr
    assert "not the coordinator's port 9500" in r.stderr and "every REGISTER will be refused" in r.stderr
    assert "ok (2 warnings)" in r.stdout


def test_a_broken_coordinator_config_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "coordinator.yaml"
    bad.write_text("bus: {endpoint: 7, nope: 1}\n")
    r = hydrad("--check-config", str(engine(tmp_path, "gpu0")), "--coordinator-config", str(bad))
    assert r.returncode == 2 and "--coordinator-config" in r.stderr and "coordinator.yaml" in r.stderr
    assert "Traceback" not in r.stderr


def test_device_written_as_a_yaml_number_is_an_index(tmp_path: Path) -> None:
    """``device: 0`` (a YAML int, as the example configs write it) binds GPU 0; a bad one names the field."""
    good = tmp_path / "bound.yaml"
    good.write_text(f"name: bound\nregistry: {REGISTRY}\nmodels_dir: {tmp_path}\ndevice: 0\n"
                    "bus: {endpoint: 'tcp://127.0.0.1:9500'}\n")
    r = hydrad("--print-config", str(good), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["device"] == {"value": "0", "source": "yaml"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndevice: [0]\n")
    r = hydrad("--check-config", str(bad))
    assert r.returncode == 2 and "device" in r.stderr

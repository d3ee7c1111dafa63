"""Checks on the systemd units shipped in units/.

``systemd-analyze verify`` catches typos in keys, values this systemd cannot
parse (e.g. Type=notify-reload before systemd 253) and missing binaries, none
of which would otherwise show up before a unit fails to start on a real host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "units"
ENGINE = UNITS / "hydrad@.service"
COORDINATOR = UNITS / "hydra-coordinator.service"
COORDINATOR_EXEC = "/usr/local/bin/hydra-coordinator"
TARGET = UNITS / "hydra.target"
NOTIFY_RELOAD_DROPIN = UNITS / "hydrad@.service.d-notify-reload.conf.example"
LLAMA_FLAGS_DROPIN = UNITS / "hydrad@.service.d-llama-server-flags.conf.example"
SHIPPED_EXEC = "/usr/local/bin/hydrad"

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (package systemd);"
    " scripts/setup installs it when run as root",
)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values, in order. Keys like DeviceAllow= repeat, so a
    plain configparser (last value wins) would hide all but one of them."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: key outside a section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _verify(unit_dir: Path, *unit_files: Path) -> subprocess.CompletedProcess[str]:
    """Run systemd-analyze verify on unit files in ``unit_dir``.

    --man=no: do not require Documentation= man pages on this host.
    --recursive-errors=no: only the given units decide the exit status, so a
    broken unrelated unit installed on the host cannot fail this test.
    """
    env = dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", *map(str, unit_files)],
        cwd=unit_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _problems(stderr: str, names: list[str]) -> list[str]:
    """Lines of systemd-analyze output that are about our unit files."""
    return [line for line in stderr.splitlines() if any(name in line for name in names)]


@needs_systemd_analyze
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # systemd-analyze verify checks that ExecStart='s binary exists and is
    # executable, and hydrad is not installed under /usr/local/bin here: point
    # the temporary copy at a fake executable instead.
    fake = tmp_path / "hydrad"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    text = ENGINE.read_text()
    assert SHIPPED_EXEC in text
    text = text.replace(SHIPPED_EXEC, str(fake))
    # Same for ExecReload='s /bin/kill, which minimal images (no procps) lack.
    if not os.access("/bin/kill", os.X_OK):
        fake_kill = tmp_path / "kill"
        fake_kill.write_text("#!/bin/sh\nexit 0\n")
        fake_kill.chmod(0o755)
        text = text.replace("/bin/kill", str(fake_kill))

    # A template cannot be verified by itself: verify an instance of it. The
    # template stays next to it so instance lookups and %i work as on a host.
    (tmp_path / ENGINE.name).write_text(text)
    instance = tmp_path / "hydrad@test.service"
    instance.write_text(text)
    target = tmp_path / TARGET.name
    shutil.copyfile(TARGET, target)
    coordinator = tmp_path / COORDINATOR.name
    assert COORDINATOR_EXEC in COORDINATOR.read_text()
    coordinator.write_text(COORDINATOR.read_text().replace(COORDINATOR_EXEC, str(fake)))

    result = _verify(tmp_path, instance, target, coordinator)
    names = [ENGINE.name, instance.name, TARGET.name, COORDINATOR.name, str(tmp_path)]
    assert result.returncode == 0, f"systemd-analyze verify failed:\n{result.stdout}{result.stderr}"
    assert _problems(result.stderr, names) == [], result.stderr


@needs_systemd_analyze
def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    """Guards the test above: verify on this host does report a bad key."""
    broken = tmp_path / "hydra-broken.service"
    broken.write_text("[Service]\nType=simple\nExecStart=/bin/true\nNoSuchKey=1\n")
    result = _verify(tmp_path, broken)
    assert _problems(result.stderr, [broken.name]), result.stderr


def test_engine_unit_declares_notify_watchdog_and_lifecycle() -> None:
    service = parse_unit(ENGINE)["Service"]
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": f"{SHIPPED_EXEC} --config /etc/hydra/%i.yaml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure",
        "RestartSec": "2",
        "WatchdogSec": "30",
        "TimeoutStartSec": "30",
        "TimeoutStopSec": "60",
        "KillMode": "mixed",
        "User": "hydra",
        "Group": "hydra",
        "StateDirectory": "hydra",
        "CacheDirectory": "hydra",
    }
    for key, value in expected.items():
        assert service.get(key) == [value], f"{key}= is {service.get(key)}, want {value!r}"
    assert "PYTHONUNBUFFERED=1" in service["Environment"]


@pytest.mark.parametrize("unit", [ENGINE, COORDINATOR], ids=lambda p: p.name)
def test_units_name_no_group_a_host_may_lack(unit: Path) -> None:
    """SupplementaryGroups=video render failed every start with status=216/GROUP on a host without
    a render group (no GPU packages). GPU access comes from the hydra user's own groups (README, install step 2)."""
    service = parse_unit(unit)["Service"]
    assert "SupplementaryGroups" not in service, service["SupplementaryGroups"]
    assert service["Group"] == ["hydra"]


def test_engine_unit_is_hardened() -> None:
    service = parse_unit(ENGINE)["Service"]
    hardening = {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateMounts": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectHostname": "yes",
        "ProtectProc": "invisible",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RemoveIPC": "yes",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
        "UMask": "0077",
        "DevicePolicy": "closed",
        "ReadWritePaths": "/var/lib/hydra /var/cache/hydra",
        "ReadOnlyPaths": "/etc/hydra",
    }
    for key, value in hardening.items():
        assert service.get(key) == [value], f"{key}= is {service.get(key)}, want {value!r}"
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]
    # What the GPU runtimes need stays open: the device nodes, /proc/driver, run-time code.
    for key in ("PrivateDevices", "ProcSubset", "MemoryDenyWriteExecute", "PrivateUsers"):
        assert key not in service, f"{key}= would take the GPU away"
    devices = service["DeviceAllow"]
    for device in (
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "char-nvidia-frontend",
    ):
        assert f"{device} rw" in devices, devices


def test_engine_unit_belongs_to_hydra_target() -> None:
    unit = parse_unit(ENGINE)
    assert unit["Unit"]["PartOf"] == ["hydra.target"]
    assert unit["Install"]["WantedBy"] == ["hydra.target"]
    target = parse_unit(TARGET)
    assert target["Unit"]["Description"]
    assert target["Install"]["WantedBy"] == ["multi-user.target"]


def test_notify_reload_dropin_clears_exec_reload() -> None:
    # Not verified with systemd-analyze: hosts with systemd < 253 reject
    # Type=notify-reload, which is why it ships as an example drop-in.
    service = parse_unit(NOTIFY_RELOAD_DROPIN)["Service"]
    assert service["Type"] == ["notify-reload"]
    assert service["ExecReload"] == [""]


def test_llama_server_flags_dropin_replaces_exec_start_with_flags_hydrad_takes() -> None:
    import shlex

    from hydrad.cli.hydrad import build_parser

    exec_start = parse_unit(LLAMA_FLAGS_DROPIN)["Service"]["ExecStart"]
    assert exec_start[0] == ""  # clears the unit's --config line first
    binary, *argv = shlex.split(exec_start[1])
    assert binary == SHIPPED_EXEC
    args = build_parser().parse_args(argv)  # a flag it refused would exit here
    assert args.config is None and [name for name, _, _ in args.llama_flags] == [
        "-m", "--host", "--port", "-c", "-np", "--alias", "--api-key-file"]
    assert "/var/lib/hydra/" in argv[1] and "/etc/hydra/" in argv[-1]  # inside the unit's sandbox


def test_coordinator_unit_is_notify_hardened_and_part_of_the_target() -> None:
    unit = parse_unit(COORDINATOR)
    service = unit["Service"]
    expected = {
        "Type": "notify", "NotifyAccess": "main", "Restart": "on-failure", "WatchdogSec": "30", "KillMode": "mixed",
        "ExecStart": f"{COORDINATOR_EXEC} --config /etc/hydra/coordinator.yaml", "User": "hydra", "Group": "hydra",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
        "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "SystemCallArchitectures": "native", "ReadWritePaths": "/var/lib/hydra", "ReadOnlyPaths": "/etc/hydra",
    }
    for key, value in expected.items():
        assert service.get(key) == [value], f"{key}= is {service.get(key)}, want {value!r}"
    for key, value in {"ProtectProc": "invisible", "ProcSubset": "pid", "PrivateUsers": "yes", "RemoveIPC": "yes",
                       "MemoryDenyWriteExecute": "yes", "ProtectKernelLogs": "yes", "ProtectClock": "yes",
                       "UMask": "0077", "SystemCallErrorNumber": "EPERM"}.items():
        assert service.get(key) == [value], f"{key}= is {service.get(key)}, want {value!r}"
    # Not ~@resources: libzmq aborts when it cannot set its threads' scheduling parameters.
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]
    assert unit["Unit"]["PartOf"] == ["hydra.target"]
    assert unit["Install"]["WantedBy"] == ["hydra.target"]
    assert parse_unit(TARGET)["Unit"]["Wants"] == ["hydra-coordinator.service"]


@pytest.mark.parametrize("unit", [ENGINE, COORDINATOR], ids=lambda p: p.name)
def test_units_raise_the_open_file_limit(unit: Path) -> None:
    """Each client connection is a file: under the default soft limit of 1,024, 1,100 idle
    connections once took an engine offline."""
    (value,) = parse_unit(unit)["Service"]["LimitNOFILE"]
    assert int(value) >= 65536


# Exposure scores of "systemd-analyze security" (0 = locked down, 10 = exposed), offline on the
# unit files. docs/operations.md ("systemd") states them; an instance on a booted systemd (tests/system)
# scores a little lower, since offline analysis cannot see some of what the manager implies.
SECURITY_LIMITS = {ENGINE: 1.6, COORDINATOR: 1.2}


def _security_score(tmp_path: Path, unit: Path) -> float:
    fake = tmp_path / "hydra-exec"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    text = unit.read_text().replace(SHIPPED_EXEC, str(fake)).replace(COORDINATOR_EXEC, str(fake))
    name = "hydrad@test.service" if unit == ENGINE else unit.name
    (tmp_path / name).write_text(text)
    env = dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="", SYSTEMD_COLORS="0")
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", name], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, f"no score from systemd-analyze security:\n{result.stdout}{result.stderr}"
    return float(match.group(1))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None
                    or "--offline" not in subprocess.run(["systemd-analyze", "--help"], capture_output=True,
                                                         text=True, check=False).stdout,
                    reason="systemd-analyze with --offline (systemd 250+) is not installed (package systemd);"
                    " scripts/setup installs it when run as root")
@pytest.mark.parametrize("unit", [ENGINE, COORDINATOR], ids=lambda p: p.name)
def test_systemd_analyze_security_score(tmp_path: Path, unit: Path) -> None:
    score = _security_score(tmp_path, unit)
    assert score <= SECURITY_LIMITS[unit], f"{unit.name}: exposure {score}, docs/operations.md promises {SECURITY_LIMITS[unit]}"
    assert score <= 5.0


def test_security_scores_stated_in_the_docs() -> None:
    doc = (UNITS.parent / "docs" / "operations.md").read_text()
    for unit, limit in SECURITY_LIMITS.items():
        assert f"{limit} OK" in doc, f"docs/operations.md does not state {unit.name}'s score {limit}"

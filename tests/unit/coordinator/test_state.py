"""The coordinator's state file: where it lives, atomic saves, and a start profile that never fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hydrad.coordinator.profiles import ProfileSet
from hydrad.coordinator.settings import CoordinatorSettings, load_config
from hydrad.coordinator.state import StateFile, choose_start_profile, default_state_dir

PROFILES = ProfileSet(profiles={"dev": {"engines": {}}, "swapped": {"engines": {}}}, default="dev")


def test_default_state_dir_follows_systemd_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_state_dir({"STATE_DIRECTORY": "/var/lib/hydra"}) == Path("/var/lib/hydra")
    assert default_state_dir({"STATE_DIRECTORY": "/var/lib/hydra:/var/lib/other"}) == Path("/var/lib/hydra")
    assert default_state_dir({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/hydra")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_dir({}) == tmp_path / ".local" / "state" / "hydra"
    assert default_state_dir({"XDG_STATE_HOME": "relative"}) == tmp_path / ".local" / "state" / "hydra"
    s = CoordinatorSettings(name="coord-1")
    assert StateFile.for_settings(s, {"STATE_DIRECTORY": "/var/lib/hydra"}).path == Path(
        "/var/lib/hydra/coord-1.state.json")


def test_state_dir_setting_resolves_against_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "coordinator.yaml"
    cfg.write_text("state_dir: ./state\n")
    assert load_config(cfg).settings.state_dir == tmp_path / "state"
    cfg.write_text("state_dir: /srv/hydra\n")
    assert load_config(cfg).settings.state_dir == Path("/srv/hydra")
    cfg.write_text("{}\n")
    assert load_config(cfg).settings.state_dir is None


def test_save_is_atomic_and_load_reads_it_back(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "deep" / "dir" / "coordinator.state.json")
    assert state.load()[0] is None and state.missing
    assert state.save("swapped")
    assert state.load() == ("swapped", None) and not state.missing
    assert state.save("dev")
    assert state.load() == ("dev", None)
    assert os.listdir(state.path.parent) == ["coordinator.state.json"]  # no temporary file left behind


def test_save_failure_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    state = StateFile(blocker / "coordinator.state.json")
    assert state.save("dev") is False


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"null", b"[]", b"{\"active_profile\": 3}",
                                     b"{\"active_profile\": \"\"}"])
def test_corrupt_state_falls_back_with_a_warning(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "coordinator.state.json"
    path.write_bytes(content)
    start = choose_start_profile(CoordinatorSettings(default_profile="swapped"), PROFILES, StateFile(path))
    assert (start.name, start.source, start.warn) == ("swapped", "default_profile", True)


def test_start_profile_choice(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "c.state.json")
    s = CoordinatorSettings()
    start = choose_start_profile(s, PROFILES, state)  # nothing saved: the profiles file's default, no warning
    assert (start.name, start.source, start.warn) == ("dev", "profiles-default", False)
    state.save("swapped")
    start = choose_start_profile(s, PROFILES, state)
    assert (start.name, start.source, start.warn) == ("swapped", "saved", False)
    start = choose_start_profile(CoordinatorSettings(default_profile="dev"), PROFILES, state)
    assert start.name == "swapped"  # the saved profile wins over default_profile
    state.save("removed-since")
    start = choose_start_profile(CoordinatorSettings(default_profile="dev"), PROFILES, state)
    assert (start.name, start.source, start.warn) == ("dev", "default_profile", True)
    assert "'removed-since' is not in the profiles file" in start.reason
    assert choose_start_profile(s, ProfileSet(), state).name is None

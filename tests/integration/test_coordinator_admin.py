"""The coordinator's admin API around profiles, against a real hydra-coordinator process (no engines,
so no model is needed): every profile with its entries and the plan a switch would carry out, and
the active profile kept across restarts in the state file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.coordinator import Coordinator
from tests.support.engine import REPO
from tests.support.wait import eventually

DEV_PROFILES = REPO / "etc" / "hydra" / "dev" / "profiles.yaml"
PAIR_PROFILES: dict[str, Any] = {
    "profiles": {
        "solo": {"description": "a serves SmolLM2", "engines": {"a": {"model": "smollm2-135m"}}},
        "pair": {"description": "a with b's device",
                 "engines": {"a": {"model": "gemma3-270m", "mode": "COMBINE", "peer": "b", "tensor_split": [0.6, 0.4]},
                             "b": {"mode": "PEER"}}},
    },
    "default": "solo",
}


def _state_file(c: Coordinator) -> Path:
    return c.config.parent / "coordinator-state" / "coordinator.state.json"


def _wait_steady(c: Coordinator, timeout: float = 30.0) -> dict[str, Any]:
    return eventually(lambda: c.http.get("/admin/profile").json(), timeout, "the profile state to be steady",
                      until=lambda doc: doc["state"] == "steady", interval=0.05)


def _restart(c: Coordinator) -> None:
    assert c.kill() == 0, c.log()[-3000:]
    c.start_again()
    c.wait_ready()


def test_profile_lists_every_profile_with_entries_and_plan(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, profiles=PAIR_PROFILES)
    try:
        c.wait_ready()
        doc = c.http.get("/admin/profile").json()
        assert doc["profiles"] == {"solo": "a serves SmolLM2", "pair": "a with b's device"}  # unchanged shape
        plans = doc["plans"]
        assert set(plans) == {"solo", "pair"}
        assert plans["solo"]["description"] == "a serves SmolLM2"
        assert plans["solo"]["engines"] == {"a": {"model": "smollm2-135m", "mode": "SOLO", "peer": None}}
        assert plans["pair"]["engines"] == {"a": {"model": "gemma3-270m", "mode": "COMBINE", "peer": "b"},
                                            "b": {"model": None, "mode": "PEER", "peer": None}}
        # no engine is registered: nothing would be reloaded now; the named engines are absent
        assert plans["solo"]["reload"] == {} and plans["solo"]["absent"] == ["a"] and plans["solo"]["unchanged"] == []
        # a COMBINE head whose peer never registered: no payload can be made for it
        assert "no RPC address known for peer 'b'" in plans["pair"]["errors"]["a"]
        assert plans["pair"]["absent"] == ["b"]
        # the switch does what the plan said
        r = c.http.post("/admin/profile", json={"name": "solo"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["engines"] == {} and out["absent"] == plans["solo"]["absent"]
        assert out["unchanged"] == plans["solo"]["unchanged"]
    finally:
        c.stop()


def test_active_profile_survives_a_restart(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, profiles=DEV_PROFILES)
    try:
        c.wait_ready()
        assert c.http.get("/admin/profile").json()["active"] == "dev"
        assert "source=profiles-default" in c.log() or "source=default_profile" in c.log()
        r = c.http.post("/admin/profile", json={"name": "swapped"})
        assert r.status_code == 200, r.text
        saved = json.loads(_state_file(c).read_text())
        assert saved["active_profile"] == "swapped" and saved["saved_at"] > 0
        assert not [p.name for p in _state_file(c).parent.iterdir() if p.name.endswith(".tmp")]

        _restart(c)
        doc = c.http.get("/admin/profile").json()
        assert doc["active"] == "swapped"
        log = c.log()
        assert "start profile" in log and "profile=swapped" in log and "source=saved" in log, log[-2000:]

        # back to dev, then wait:false: the name is saved as the switch begins
        assert c.http.post("/admin/profile", json={"name": "dev", "wait": False}).status_code == 202
        _wait_steady(c)
        assert json.loads(_state_file(c).read_text())["active_profile"] == "dev"
        _restart(c)
        assert c.http.get("/admin/profile").json()["active"] == "dev"
    finally:
        c.stop()


def test_bad_saved_state_falls_back_to_the_default(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, profiles=DEV_PROFILES, default_profile="swapped")
    try:
        c.wait_ready()
        assert c.http.get("/admin/profile").json()["active"] == "swapped"  # no state yet: default_profile
        state = _state_file(c)
        for junk, why in ((b"{\"active_profile\": \"swa", "is not valid JSON"),
                          (b"\xff\xfe garbage", "is not valid JSON"),
                          (b"[1, 2]", "has no 'active_profile' string"),
                          (b"{\"active_profile\": \"gone\"}", "the saved profile 'gone' is not in the profiles file")):
            assert c.kill() == 0
            state.parent.mkdir(parents=True, exist_ok=True)
            state.write_bytes(junk)
            before = len(c.log())
            c.start_again()
            c.wait_ready()
            doc = c.http.get("/admin/profile").json()
            assert doc["active"] == "swapped", junk
            new = c.log()[before:]
            assert "level=warning" in new and "saved state unusable" in new and why in new and "source=default_profile" in new, new
    finally:
        c.stop()


def test_unwritable_state_dir_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be\n")
    c = Coordinator(tmp_path, profiles=DEV_PROFILES, extra={"state_dir": str(blocker / "state")})
    try:
        c.wait_ready()
        r = c.http.post("/admin/profile", json={"name": "swapped"})
        assert r.status_code == 200, r.text
        assert c.http.get("/admin/profile").json()["active"] == "swapped"
        eventually(lambda: "cannot save the active profile" in c.log(), 5, "the failed save's log line",
                   interval=0.05, context=lambda: c.log()[-3000:])
        _restart(c)
        assert c.http.get("/admin/profile").json()["active"] == "dev"  # nothing was saved
    finally:
        c.stop()

"""Heartbeats and the systemd watchdog ride the engine's pulse loop, not the loop requests run on.

A request marked with the fault stage ``loop`` (hydrad/engine/faults.py, armed by the test's
environment only) holds the engine's main event loop for 4 s, as a request's own work once did.
On the main loop, the heartbeat and the watchdog ping stopped with it: the coordinator declared the
engine dead after 3 intervals (1.5 s here) and failed every stream on it. On the pulse they go on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from hydrad.engine import faults
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

STALL_S = 4.0
ENV = {faults.ENV: "1", "HYDRA_FAULT_LOOP_S": str(STALL_S)}
PROFILES = {"profiles": {"one": {"engines": {"solo": {"model": "smollm2-135m"}}}}, "default": "one"}


def _stalling_chat(http: httpx.Client, out: dict[str, Any]) -> None:
    t0 = time.monotonic()
    r = http.post("/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": f"Say hi. {faults.marker(faults.STALL)}"}],
        "max_tokens": 4, "temperature": 0})
    out.update(status=r.status_code, text=r.text, seconds=time.monotonic() - t0)


def test_a_held_main_loop_does_not_get_the_engine_declared_dead(tmp_path: Path, smollm_path: Path,
                                                               start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, profiles=PROFILES, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        e = start_engine(name="solo", defaults={"n_ctx": 1024, "n_parallel": 2, "n_threads": 1, "temperature": 0},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)}, env=ENV)
        c.wait_engines(lambda es: es.get("solo", {}).get("stage") == "ready", timeout=120)
        out: dict[str, Any] = {}
        asker = threading.Thread(target=_stalling_chat, args=(c.http, out))
        asker.start()
        seen: list[bool] = []
        deadline = time.monotonic() + STALL_S + 1.0
        while time.monotonic() < deadline:  # 3 intervals of silence (1.5 s) would have been "down"
            seen.append(c.engines()["solo"]["alive"])
            time.sleep(0.1)
        asker.join(60)
        assert out.get("status") == 200, out
        assert out["seconds"] >= STALL_S * 0.9, out  # the stall did happen, on the request's way in
        assert seen and all(seen), f"declared dead during the stall: {seen}"
        assert "engine down" not in c.log(), c.log()[-3000:]
        e.assert_running()
    finally:
        c.stop()


def test_the_watchdog_pings_while_the_main_loop_is_held(start_engine: Callable[..., Engine]) -> None:
    e = start_engine(defaults={"model": "smollm2-135m", "n_ctx": 1024, "n_threads": 1},
                     env={**ENV, "WATCHDOG_USEC": "400000"})
    e.wait_ready()
    out: dict[str, Any] = {}
    asker = threading.Thread(target=_stalling_chat, args=(e.http, out))
    before = e.notify.lines().count("WATCHDOG=1")
    asker.start()
    time.sleep(STALL_S - 1.0)  # inside the stall: the main loop has not run since the request came
    during = e.notify.lines().count("WATCHDOG=1") - before
    asker.join(60)
    assert out.get("status") == 200 and out["seconds"] >= STALL_S * 0.9, out
    assert during >= 5, f"{during} watchdog pings in {STALL_S - 1.0:g} s of a held main loop (every 0.2 s expected)"

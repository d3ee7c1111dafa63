"""Replay a recorded pool into the console: ``tests/data/console-stream.json`` holds the admin API's
answers at a few moments, the PUB events in between (``t`` seconds from the start) and what each
engine's own HTTP API answers. Used by the SVG snapshot tests and by ``scripts/console-screenshot``
(the README's picture), so both show the same, reproducible pool.

The console's clock is the recording's: heartbeat ages, load times and ETAs come out the same on
every run. Event times print as local time; set ``TZ=UTC`` for the times of the recording.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

from tests.support.engine import REPO
from tui.app import HydraConsole
from tui.feed import AdminError, FeedEvent

STREAM = REPO / "tests" / "data" / "console-stream.json"
CLOCK0 = 10_000.0  # the console's monotonic clock at t = 0


def load_stream(path: Path = STREAM) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


class ReplayClock:
    """The console's clock, moved by the replay."""

    def __init__(self) -> None:
        self.t = 0.0
        self.snapshot_seq = 0  # the console's event count when the latest recorded admin answer was taken

    def __call__(self) -> float:
        return CLOCK0 + self.t


class ReplayAdmin:
    """Answers ``/admin/*`` as the recording says the coordinator did at the clock's time."""

    def __init__(self, stream: dict[str, Any], clock: ReplayClock) -> None:
        self.snapshots = sorted(stream["snapshots"], key=lambda s: s["t"])
        self.clock = clock
        self.switched: list[str] = []
        self._lock = threading.Lock()

    def _now(self) -> dict[str, Any]:
        now = [s for s in self.snapshots if s["t"] <= self.clock.t + 1e-9]
        return now[-1] if now else self.snapshots[0]

    def engines(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._now()["engines"])

    def profile(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._now()["profile"])

    def switch(self, name: str) -> dict[str, Any]:
        with self._lock:
            self.switched.append(name)
            return {"profile": name, "state": "switching"}


class ReplayEngineApi:
    """Each engine's ``GET /control/config`` and ``GET /slots`` from the recording (by HTTP address)."""

    def __init__(self, stream: dict[str, Any]) -> None:
        self.by_url: dict[str, dict[str, Any]] = {}
        first = stream["snapshots"][0]["engines"]["engines"]
        for item in first:
            self.by_url[f"http://{item['http']}"] = stream["engine_api"].get(item["name"], {})

    def config(self, base_url: str) -> dict[str, Any]:
        api = self.by_url.get(base_url)
        if api is None:
            raise AdminError(f"cannot reach the engine at {base_url}: connection refused")
        if api.get("config_error") == 403:
            raise AdminError("the engine refuses /control/config from this host (its control_allow_from does not "
                             "list it): /control is not allowed from 10.0.0.5 (control_allow_from)", 403)
        return copy.deepcopy(api["config"])

    def slots(self, base_url: str) -> list[dict[str, Any]]:
        api = self.by_url.get(base_url)
        if api is None:
            raise AdminError(f"cannot reach the engine at {base_url}: connection refused")
        return copy.deepcopy(api["slots"])


def make_app(stream: dict[str, Any] | None = None, **kw: Any) -> tuple[HydraConsole, ReplayClock]:
    """A console fed by the recording (no network); the admin API is asked at start, on ``r``, and
    for a switch's plan only, so what it shows is what the replay posts."""
    stream = stream if stream is not None else load_stream()
    clock = ReplayClock()
    opts: dict[str, Any] = {"refresh_s": 600, "refresh_on_events": False, "admin_url": "http://10.0.0.5:9000",
                            "toast_s": 3600, **kw}  # a toast must not expire before a snapshot on a slow machine
    app = HydraConsole(admin=ReplayAdmin(stream, clock), engine_api=ReplayEngineApi(stream), events=None,
                       clock=clock, **opts)
    return app, clock


async def replay(app: HydraConsole, clock: ReplayClock, pilot: Any, until: float,
                 stream: dict[str, Any] | None = None) -> None:
    """Post the recording's events up to ``until`` seconds in time order (one batch per instant, the
    clock moved to it), then fetch the admin API: it answers with its latest recorded answer, which
    the console takes as of when it was recorded (events after it keep what they said), as it does
    with a slow answer; heartbeat figures come out fresh, as with the console's periodic fetches."""
    stream = stream if stream is not None else load_stream()
    base = float(stream["base"])
    marks = sorted(sn["t"] for sn in stream["snapshots"] if clock.t < sn["t"] <= until)
    events = [e for e in stream["events"] if clock.t < e["t"] <= until]
    i = 0
    while i < len(events):
        t = events[i]["t"]
        while marks and marks[0] < t:  # the admin answer recorded before this instant
            marks.pop(0)
            clock.snapshot_seq = app.pool.seq
        batch = []
        while i < len(events) and events[i]["t"] == t:
            batch.append(FeedEvent(events[i]["topic"], base + t, events[i]["data"]))
            i += 1
        clock.t = t
        seen = app.pool.events_seen
        app.post_message(app.PoolEvents(batch))
        while app.pool.events_seen < seen + len(batch):
            await pilot.pause(0.01)
    if marks:
        clock.snapshot_seq = app.pool.seq
    clock.t = until
    before = app.snapshots
    app._fetch_admin(clock.snapshot_seq)
    while app.snapshots <= before:
        await pilot.pause(0.01)
    await pilot.pause(0.05)


async def started(app: HydraConsole, pilot: Any) -> None:
    """Until the first admin snapshot is in."""
    while app.snapshots < 1:
        await pilot.pause(0.01)

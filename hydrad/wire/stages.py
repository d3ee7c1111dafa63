"""An engine's stage: the one list, and the sets each reader of it needs.

The engine reports its stage (``/health``, ``/metrics``, the bus heartbeat, INFO); the
coordinator routes on it and the console shows it. Every set below is defined here once.
"""

from __future__ import annotations

from typing import Any

STAGES = ("starting", "idle", "loading_model", "warming", "ready", "reloading", "sleeping", "stopping")

SERVING_STAGES = frozenset({"ready", "reloading"})
"""The current generation answers requests (during a reload the old one still serves)."""

INCOMING_STAGES = frozenset({"loading_model", "warming"})
"""A model is on its way in and nothing serves yet: a request would wait for it."""

LOADING_STAGES = INCOMING_STAGES | {"reloading"}
"""A load is running (its progress is worth showing)."""

SLEEPING = "sleeping"
"""The idle sleep freed the model (``sleep_idle_seconds``); the engine still names it, and the next
request loads it again and is served: routing treats it as an engine that can load its model."""

ROUTABLE_STAGES = SERVING_STAGES | INCOMING_STAGES | {"idle", SLEEPING}
"""An engine the coordinator may route to (or configure for a request)."""

HEALTH_STATUS = {"loading_model": "loading", "warming": "loading", "stopping": "stopping"}
"""``/health``'s ``status`` word for a stage that does not serve (the stage name otherwise)."""


def fetch_text(fetch: dict[str, Any] | None) -> str | None:
    """One line for a model file transfer under way (``EngineStatus.fetch``, ``LoadRecord.fetch``):
    'fetching 37%, 120 MB/s, ETA 12 s', what /health, the switcher's progress and the console show."""
    if not fetch:
        return None
    total = fetch.get("total") or 0
    pct = 100.0 * fetch.get("bytes", 0) / total if total else 0.0
    text = f"fetching {pct:.0f}%"
    bps = fetch.get("bps")
    if bps:
        text += f", {bps / 1e6:.0f} MB/s"
    eta = fetch.get("eta_s")
    if eta is not None:
        text += f", ETA {eta:.0f} s"
    return text

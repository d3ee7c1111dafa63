"""An engine's stage: the one list, and the sets each reader of it needs.

The engine reports its stage (``/health``, ``/metrics``, the bus heartbeat, INFO); the
coordinator routes on it and the console shows it. Every set below is defined here once.
"""

from __future__ import annotations

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

"""The coordinator's events (its PUB socket), as a console reads them: frames ``[topic, JSON]`` so
a subscriber can choose topics by prefix."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hydrad.wire.messages import BusDecodeError, _first_error

EVENT_TOPICS = (
    "engine.up", "engine.down", "engine.stage", "engine.progress",
    "engine.load", "route", "profile.start", "profile.progress", "profile.engine", "profile.done",
    "session.kept", "session.restored", "session.moved",
)


class Event(BaseModel):
    """One event on the PUB socket: frames ``[topic, JSON]`` so a console can subscribe by prefix."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    topic: str = Field(max_length=64)
    ts: float
    data: dict[str, Any] = Field(default_factory=dict)

    def frames(self) -> list[bytes]:
        return [self.topic.encode(), json.dumps({"topic": self.topic, "ts": self.ts, "data": self.data},
                                                separators=(",", ":"), default=str).encode()]

    @classmethod
    def from_frames(cls, frames: list[bytes]) -> Event:
        """Subscriber side; raises ``BusDecodeError`` like ``decode``."""
        try:
            if len(frames) != 2:
                raise BusDecodeError(f"expected 2 frames (topic, body), got {len(frames)}")
            return cls.model_validate_json(bytes(frames[1]))
        except BusDecodeError:
            raise
        except Exception as exc:
            raise BusDecodeError(f"bad event: {_first_error(exc)}") from None

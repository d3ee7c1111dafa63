"""What travels between the event loop and the engine thread: requests in, events out (the one
event stream of :mod:`hydrad.wire.events`, which the bus carries on and every renderer reads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


from hydrad.wire.events import Done, Event, Failed, Progress, Token, Usage
from hydrad.wire.requests import GenRequest

__all__ = ["Done", "Event", "Failed", "GenerationTag", "Progress", "RequestHandle", "Token", "Usage"]


@dataclass(frozen=True)
class GenerationTag:
    """Which generation (model + parameters that built it) served a request."""

    id: int
    model: str
    params_hash: str

    @property
    def fingerprint(self) -> str:
        return f"hydra-g{self.id}-{self.params_hash}"


class RequestHandle:
    """The event-loop side of a request: events arrive on an unbounded queue fed once per step."""

    def __init__(self, request: GenRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.finished = False
        self.t_enqueued = 0.0  # set by the engine thread when the request joins the wait queue
        self.generation: GenerationTag | None = None  # set by the engine thread when a slot takes the request
        self.t_submit = time.monotonic()
        self.t_first_token = 0.0  # engine thread: when the first token was sampled
        self.t_admitted = 0.0  # engine thread: when the request got its slot (its prefill can start)

    @property
    def id(self) -> int:
        return self.request.id

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.queue.get()
            yield ev
            if isinstance(ev, (Done, Failed)):
                self.finished = True
                return

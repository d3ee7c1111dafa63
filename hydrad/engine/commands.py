"""Commands to the engine thread, one class each; ``EngineCore._handle`` dispatches on the class.

Async code and the loader thread never change the engine's state themselves: they put one of
these on the engine's queue. Commands that answer carry a ``concurrent.futures.Future``.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from hydrad.common.params import RuntimeParams
from hydrad.engine.requests import RequestHandle

if TYPE_CHECKING:
    from hydrad.engine.generation import Generation
    from hydrad.engine.loader import LoadRecord


@dataclass(frozen=True)
class Submit:
    """A request for the queue (refused at once when the engine cannot take it)."""

    handle: RequestHandle


@dataclass(frozen=True)
class SubmitBurst:
    """Requests submitted in one pass of the event loop, queued together (EngineCore.submit)."""

    handles: tuple[RequestHandle, ...]


@dataclass(frozen=True)
class Cancel:
    """The client went away: drop the request from the queue or free its slot."""

    handle: RequestHandle


@dataclass(frozen=True)
class SetDefaults:
    """T1: the per-request defaults in force change; nothing is rebuilt."""

    params: RuntimeParams


@dataclass(frozen=True)
class StateGet:
    """Read an idle slot's KV state; answers ``(meta, bytes)``."""

    slot_id: int
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class StatePut:
    """Restore an idle slot from meta + bytes; ``trusted`` is False for KV from an unauthenticated
    sender, and the slot is then marked foreign (see ``Slot.foreign``)."""

    slot_id: int
    meta: dict[str, Any]
    data: Any
    trusted: bool = False
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class StateErase:
    """Empty an idle slot's KV (llama-server's ``?action=erase``); answers how many tokens it held."""

    slot_id: int
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Embed:
    """Embed ``inputs`` (token lists, each checked against the embedding context's size) with the
    embedding context of generation ``gen_id``; answers one array per input (``engine/embedjobs.py``)."""

    gen_id: int
    inputs: list[list[int]]
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Rebuild:
    """T2: rebuild the context with ``params`` once no slot is active; answers seconds and carried slots."""

    params: RuntimeParams
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Install:
    """A loader thread's finished generation takes over (at once for overlap, when idle for carry_kv)."""

    gen: Generation
    rec: LoadRecord
    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Unload:
    """Free the generation once no slot is active; the engine becomes model-less."""

    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Drain:
    """Drain-policy reload: stop admitting, let in-flight requests finish (bounded), free the generation,
    then set ``done`` so the loader thread builds the next one."""

    rec: LoadRecord
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class SwitchStandby:
    """An expert-mode switch between two resident generations: the standby serves, the serving one
    stands by. Refused (``SlotsBusy``) while a request is decoding."""

    fut: cf.Future[Any] = field(default_factory=cf.Future)


@dataclass(frozen=True)
class Abandon:
    """A COMBINE peer of generation ``gen_id`` is gone: fail its requests and set it aside without a
    free (freeing would talk to the dead peer, and llama.cpp aborts when it cannot)."""

    gen_id: int
    reason: str


@dataclass(frozen=True)
class Resume:
    """Wakes the loop so queued requests are re-examined (after a failed or aborted load)."""


@dataclass(frozen=True)
class Stop:
    """End every remaining request, free llama.cpp and leave the loop."""


Swap = Union[Rebuild, Install, Unload]
"""The commands that replace or free the generation; one at a time is pending."""

Command = Union[Submit, SubmitBurst, Cancel, SetDefaults, StateGet, StatePut, StateErase, Embed, Rebuild, Install, Unload, Drain,
                Abandon, SwitchStandby, Resume, Stop]

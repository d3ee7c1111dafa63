"""The merged port's places for identified control sessions, which an idle session gives up.

``rpc.max_control_connections`` bounds the Hydra control sessions served at once, and only a
session that identified itself (its HELLO with the token, on an engine that has one) takes a
place: connections still pending have their own bound (``server.py``). A session that said HELLO
and then sent nothing used to keep its place until ``rpc.control_idle_timeout_s`` passed, so as
many such sessions as places locked every configure out for a minute at a time. Now, when every
place is held, the idle session (between requests, not inside one) whose last request began the
longest ago is closed and its place goes to the newcomer at once; BUSY is left for when every
session is inside a request. The order is taken when a request begins, not when its answer is
done: the client has its answer before the serving thread marks the session idle, so two sessions
that spoke one after the other could otherwise swap places in the queue.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class _Place:
    conn: socket.socket
    busy: bool = False
    since: float = 0.0  # when its last request began, or it took its place (monotonic)


class ControlPlaces:
    """Thread-safe; ``key`` is the connection's own (its pending key)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[int, _Place] = {}
        self._lock = threading.Lock()
        self.idle_closed = 0  # idle sessions closed to make room (INFO's stats)

    def take(self, key: int, conn: socket.socket) -> bool:
        """A place for an identified session; False (answer BUSY) only when every place is inside a request."""
        victim = None
        with self._lock:
            if len(self._held) >= self.limit:
                idle = [(p.since, k) for k, p in self._held.items() if not p.busy]
                if not idle:
                    return False
                _, gone = min(idle)
                victim = self._held.pop(gone).conn
                self.idle_closed += 1
            self._held[key] = _Place(conn, since=time.monotonic())
        if victim is not None:
            try:
                victim.shutdown(socket.SHUT_RDWR)  # wakes its thread, whose next read ends the session
            except OSError:
                pass
        return True

    def busy(self, key: int) -> bool:
        """The session starts a request; False when it lost its place meanwhile (it must end unserved)."""
        with self._lock:
            place = self._held.get(key)
            if place is None:
                return False
            place.busy, place.since = True, time.monotonic()
            return True

    def idle(self, key: int) -> None:
        """The session's request is answered; it waits for the next one."""
        with self._lock:
            place = self._held.get(key)
            if place is not None:
                place.busy = False

    def leave(self, key: int) -> None:
        with self._lock:
            self._held.pop(key, None)

    @property
    def held(self) -> int:
        return len(self._held)

"""Where KV lives: which engine served a session, where its newest turn's KV was left, and which
conversation prefixes each engine has seen. The one owner of that state in the coordinator:
routing reads it, the session keeper (the Store's copies) and mobility (moves between engines)
update it through its methods.

Routing's first step sends a request to the engine that already holds its KV, so a follow-up
turn only prefills what is new. Two keys lead there:

- a **session id** (request field ``session_id`` or header ``X-Session-Id``), mapped to the
  engine of its last turn;
- a **conversation hash**: after a chat turn we record the hash of the messages *plus the
  reply*; the next turn's messages minus its new user message hash to the same value, so a
  client that sends no session id still lands on its KV.

Both tables are bounded (least recently used out first) and an engine's entries are dropped
when its KV is gone (it died, restarted or changed model).

For moving a session's KV, each session also has a :class:`Latest`: the engine and slot its
newest turn left the KV in and the KV's digest (kept after its engine went away, so the model it
was made for is still known), and at most one pin: the slot a move or restore just filled, which
the session's next turn on that engine must take.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import xxhash

MAX_SESSIONS = 100_000
MAX_PREFIXES = 50_000


def conversation_hash(messages: list[dict[str, Any]]) -> str | None:
    if not messages:
        return None
    canon = json.dumps([[m.get("role"), m.get("content")] for m in messages], separators=(",", ":"), ensure_ascii=False)
    return xxhash.xxh3_64_hexdigest(canon.encode())


def prefix_of(messages: list[dict[str, Any]] | None) -> str | None:
    """The hash a previous turn of this conversation would have recorded (all but the last message)."""
    if not messages or len(messages) < 2:
        return None
    return conversation_hash(messages[:-1])


@dataclass
class Latest:
    """Where a session's newest turn left its KV (DONE's slot and digest), kept in the Store or not: a
    session taking turns back to back is often not kept (its slot is busy with the next turn when the
    keeper reads it), but its KV can still move engine to engine from there."""

    engine: str
    slot: int
    kv_hash: str
    model: str
    # The coordinator put this KV there (a move or a restore) without the engines' token: the engine
    # holds it as foreign, and only a turn pinned to the slot reuses it (docs/engine.md, trust of KV
    # state). So every later turn of the session on that engine is pinned there too.
    placed: bool = False


class Affinity:
    def __init__(self, max_sessions: int = MAX_SESSIONS, max_prefixes: int = MAX_PREFIXES) -> None:
        self.max_sessions = max_sessions
        self.max_prefixes = max_prefixes
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session → engine
        self._prefixes: OrderedDict[str, str] = OrderedDict()  # conversation hash → engine
        self._by_engine: dict[str, tuple[set[str], set[str]]] = {}
        self._latest: OrderedDict[str, Latest] = OrderedDict()  # session → where its newest turn's KV is
        self._pins: dict[str, tuple[str, int]] = {}  # session → (engine, slot) a move or restore filled

    def _index(self, engine: str) -> tuple[set[str], set[str]]:
        return self._by_engine.setdefault(engine, (set(), set()))

    def record(self, engine: str, session: str | None, messages: list[dict[str, Any]] | None, reply: str | None,
               ns: str = "") -> None:
        """A turn finished on ``engine``: its KV now holds this session and this conversation (in the
        cache namespace ``ns``: a conversation of another namespace is not routed by it)."""
        if session:
            old = self._sessions.pop(session, None)
            if old is not None and old in self._by_engine:
                self._by_engine[old][0].discard(session)
            self._sessions[session] = engine
            self._index(engine)[0].add(session)
            while len(self._sessions) > self.max_sessions:
                s, e = self._sessions.popitem(last=False)
                self._by_engine.get(e, (set(), set()))[0].discard(s)
        if messages and reply is not None:
            h = conversation_hash([*messages, {"role": "assistant", "content": reply}])
            if h is not None and ns:
                h = f"{ns}/{h}"
            if h is not None:
                old = self._prefixes.pop(h, None)
                if old is not None and old in self._by_engine:
                    self._by_engine[old][1].discard(h)
                self._prefixes[h] = engine
                self._index(engine)[1].add(h)
                while len(self._prefixes) > self.max_prefixes:
                    p, e = self._prefixes.popitem(last=False)
                    self._by_engine.get(e, (set(), set()))[1].discard(p)

    def touch(self, session: str | None) -> None:
        if session and session in self._sessions:
            self._sessions.move_to_end(session)

    def engine_of(self, session: str) -> str | None:
        return self._sessions.get(session)

    def sessions_on(self, engine: str) -> frozenset[str]:
        idx = self._by_engine.get(engine)
        return frozenset(idx[0]) if idx else frozenset()

    def prefixes_on(self, engine: str) -> frozenset[str]:
        idx = self._by_engine.get(engine)
        return frozenset(idx[1]) if idx else frozenset()

    def holds(self, engine: str, session: str | None, prefix: str | None) -> tuple[frozenset[str], frozenset[str]]:
        """The (at most one-element) session and prefix sets routing needs for this request.

        Handing routing only the request's own keys keeps a route O(engines), not O(sessions).
        """
        sessions = frozenset({session}) if session and self._sessions.get(session) == engine else frozenset()
        prefixes = frozenset({prefix}) if prefix and self._prefixes.get(prefix) == engine else frozenset()
        return sessions, prefixes

    def forget_engine(self, engine: str) -> int:
        """The engine's KV is gone: drop every entry that points at it; returns how many sessions it held."""
        sessions, prefixes = self._by_engine.pop(engine, (set(), set()))
        for s in sessions:
            if self._sessions.get(s) == engine:
                del self._sessions[s]
        for p in prefixes:
            if self._prefixes.get(p) == engine:
                del self._prefixes[p]
        return len(sessions)

    def counts(self) -> dict[str, int]:
        return {e: len(idx[0]) for e, idx in self._by_engine.items()}

    # ----- a session's newest KV, for moves between engines ----------------------------

    def turn_ended(self, session: str, engine: str, slot: int, kv_hash: str, model: str) -> None:
        """DONE named the slot and digest of a session's turn: that is where its KV is now. A slot the
        coordinator placed the KV in stays marked placed while turns keep using it."""
        prev = self._latest.get(session)
        placed = prev is not None and prev.placed and prev.engine == engine and prev.slot == slot
        self._latest[session] = Latest(engine, slot, kv_hash, model, placed)
        self._latest.move_to_end(session)
        while len(self._latest) > self.max_sessions:
            self._latest.popitem(last=False)

    def placed(self, session: str, engine: str, slot: int, kv_hash: str, model: str, *, foreign: bool,
               pin: bool) -> None:
        """A move or a restore put the session's KV into ``slot`` of ``engine``; ``pin``: its next turn
        there must take that slot; ``foreign``: put without the engines' token (see :class:`Latest`)."""
        self._latest[session] = Latest(engine, slot, kv_hash, model, placed=foreign)
        self._latest.move_to_end(session)
        if pin:
            self._pins[session] = (engine, slot)
        self.record(engine, session, None, None)

    def latest(self, session: str) -> Latest | None:
        return self._latest.get(session)

    def left_on(self, engine: str) -> list[str]:
        """Sessions whose newest turn's KV was left on ``engine`` (to move off it before it goes)."""
        return [s for s, at in self._latest.items() if at.engine == engine]

    def slot_of(self, session: str, engine: str) -> int | None:
        """The slot every turn of the session on ``engine`` is pinned to, while the KV there is one the
        coordinator placed without the engines' token (see :class:`Latest`); else None."""
        at = self._latest.get(session)
        return at.slot if at is not None and at.placed and at.engine == engine else None

    def pin(self, session: str, engine: str, slot: int) -> None:
        """The session's next turn on ``engine`` goes to ``slot`` (where its KV was just put)."""
        self._pins[session] = (engine, slot)

    def pinned(self, session: str, engine: str) -> int | None:
        """The slot a moved or restored session waits in on ``engine`` (once: the turn then owns it)."""
        pin = self._pins.get(session)
        if pin is None or pin[0] != engine:
            return None
        del self._pins[session]
        return pin[1]

    def forget_latest(self, session: str) -> None:
        self._latest.pop(session, None)
        self._pins.pop(session, None)

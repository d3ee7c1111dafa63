"""Where KV lives (coordinator/affinity.py): session and conversation-prefix tables, bounded, per engine."""

from __future__ import annotations

from hydrad.coordinator.affinity import Affinity, conversation_hash, prefix_of

TURN1 = [{"role": "user", "content": "Hi"}]
REPLY1 = "Hello!"
TURN2 = [*TURN1, {"role": "assistant", "content": REPLY1}, {"role": "user", "content": "How are you?"}]


def test_the_next_turn_hashes_to_what_the_previous_turn_recorded() -> None:
    a = Affinity()
    a.record("e1", None, TURN1, REPLY1)
    prefix = prefix_of(TURN2)
    assert prefix is not None and prefix in a.prefixes_on("e1")
    assert a.holds("e1", None, prefix) == (frozenset(), frozenset({prefix}))
    assert a.holds("e2", None, prefix) == (frozenset(), frozenset())


def test_hashes_of_nothing() -> None:
    assert conversation_hash([]) is None
    assert prefix_of(None) is None and prefix_of(TURN1) is None  # a first turn has no previous one
    assert conversation_hash(TURN1) == conversation_hash([{"role": "user", "content": "Hi", "name": "x"}])
    assert conversation_hash(TURN1) != conversation_hash([{"role": "system", "content": "Hi"}])


def test_a_session_follows_its_last_turn() -> None:
    a = Affinity()
    a.record("e1", "s", None, None)
    assert a.engine_of("s") == "e1" and a.sessions_on("e1") == {"s"}
    a.record("e2", "s", None, None)
    assert a.engine_of("s") == "e2" and a.sessions_on("e1") == frozenset() and a.sessions_on("e2") == {"s"}
    assert a.holds("e2", "s", None) == (frozenset({"s"}), frozenset())
    assert a.holds("e1", "s", None) == (frozenset(), frozenset())
    assert a.counts() == {"e1": 0, "e2": 1}


def test_no_reply_records_no_prefix() -> None:
    a = Affinity()
    a.record("e1", None, TURN1, None)
    assert a.prefixes_on("e1") == frozenset()


def test_sessions_are_bounded_least_recently_used_first() -> None:
    a = Affinity(max_sessions=2)
    a.record("e1", "s1", None, None)
    a.record("e1", "s2", None, None)
    a.touch("s1")  # s2 is now the oldest
    a.record("e2", "s3", None, None)
    assert a.engine_of("s2") is None and a.engine_of("s1") == "e1" and a.engine_of("s3") == "e2"
    assert a.sessions_on("e1") == {"s1"}
    a.touch("unknown")  # harmless


def test_prefixes_are_bounded() -> None:
    a = Affinity(max_prefixes=1)
    a.record("e1", None, TURN1, "one")
    a.record("e2", None, TURN1, "two")
    assert a.prefixes_on("e1") == frozenset() and len(a.prefixes_on("e2")) == 1


def test_forgetting_an_engine_drops_only_its_entries() -> None:
    a = Affinity()
    a.record("e1", "s1", TURN1, REPLY1)
    a.record("e1", "s2", None, None)
    a.record("e2", "s3", None, None)
    assert a.forget_engine("e1") == 2
    assert a.engine_of("s1") is None and a.engine_of("s3") == "e2"
    assert a.holds("e1", None, prefix_of(TURN2)) == (frozenset(), frozenset())
    assert a.forget_engine("e1") == 0 and a.forget_engine("never") == 0


def test_a_sessions_newest_kv_and_its_pin_live_in_the_one_affinity() -> None:
    """Where a session's newest turn left its KV, the slot a move filled (taken once) and the slot a
    foreign placement keeps pinned: one record, which routing, the keeper and mobility all read."""
    a = Affinity()
    a.turn_ended("s", "e1", 2, "h1", "m")
    assert a.left_on("e1") == ["s"] and a.slot_of("s", "e1") is None  # the engine's own KV: no pin
    a.placed("s", "e2", 5, "h1", "m", foreign=True, pin=True)
    assert a.engine_of("s") == "e2" and a.left_on("e1") == [] and a.left_on("e2") == ["s"]
    assert a.pinned("s", "e1") is None and a.pinned("s", "e2") == 5 and a.pinned("s", "e2") is None
    assert a.slot_of("s", "e2") == 5  # foreign KV: every later turn there takes that slot
    a.turn_ended("s", "e2", 5, "h2", "m")
    assert a.slot_of("s", "e2") == 5, "a turn in the placed slot keeps it placed"
    a.turn_ended("s", "e2", 1, "h3", "m")
    assert a.slot_of("s", "e2") is None, "a turn in another slot made the engine's own KV"
    a.forget_latest("s")
    assert a.latest("s") is None and a.left_on("e2") == []

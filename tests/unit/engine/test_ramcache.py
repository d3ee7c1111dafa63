"""The host-memory prompt cache's bookkeeping: budget, least recently used first out, namespaces, models."""

from __future__ import annotations

from hydrad.engine.ramcache import MIB, RamPromptCache


def test_the_best_match_is_the_longest_prefix_of_the_namespace_and_model() -> None:
    c = RamPromptCache(1)
    assert c.put(1, "alice", [1, 2, 3, 4], b"a" * 100)
    assert c.put(1, "alice", [1, 2, 9], b"b" * 100)
    assert c.put(1, "bob", [1, 2, 3, 4, 5], b"c" * 100)
    n, e = c.best(1, "alice", [1, 2, 3, 4, 7], limit=10, cuttable=True)
    assert n == 4 and e is not None and e.data == b"a" * 100
    assert c.best(1, "carol", [1, 2, 3], limit=10, cuttable=True) == (0, None)  # another key's never
    assert c.best(2, "alice", [1, 2, 3], limit=10, cuttable=True) == (0, None)  # another model's never
    n, e = c.best(1, "alice", [1, 2, 3, 4, 7], limit=3, cuttable=True)
    assert n == 3  # never past the limit (the prompt's last token is decoded again)
    n, e = c.best(1, "alice", [1, 2, 3, 8], limit=10, cuttable=False)
    assert (n, e) == (0, None)  # a state that cannot be cut counts only whole


def test_the_budget_evicts_the_least_recently_used_and_refuses_what_cannot_fit() -> None:
    c = RamPromptCache(1)
    half = b"x" * (MIB // 2)
    assert c.put(1, "", [1], half) and c.put(1, "", [2], half)
    c.best(1, "", [1, 5], limit=9, cuttable=True)  # [1] used: [2] is now the oldest
    assert c.put(1, "", [3], half)
    assert c.best(1, "", [2, 5], limit=9, cuttable=True)[1] is None
    assert c.best(1, "", [1, 5], limit=9, cuttable=True)[1] is not None
    assert c.public()["evicted"] == 1 and c.public()["bytes"] == MIB
    assert not c.put(1, "", [4], b"y" * (MIB + 1))
    assert c.public()["too_large"] == 1


def test_a_longer_turn_of_the_same_conversation_replaces_the_shorter_and_zero_disables() -> None:
    c = RamPromptCache(1)
    c.put(1, "", [1, 2], b"a")
    c.put(1, "", [1, 2, 3], b"bb")
    assert c.public()["entries"] == 1 and c.public()["bytes"] == 2
    c.resize(0)
    assert not c.enabled and c.public()["entries"] == 0
    c.resize(-1)
    assert c.enabled and c.put(1, "", [5], b"z" * (2 * MIB)) and c.public()["limit_mib"] == -1

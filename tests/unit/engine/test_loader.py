"""The load policy decision (``choose_policy``): overlap when the new generation fits, drain otherwise."""

from __future__ import annotations

import pytest

from hydrad.engine.loader import choose_policy

GB = 1 << 30


def test_first_load_always_overlaps_whatever_was_asked() -> None:
    for requested in ("auto", "drain", "overlap"):
        chosen, why = choose_policy(requested, need=8 * GB, free=1 * GB, has_current=False)
        assert chosen == "overlap"
        assert why == {"need_bytes": 8 * GB, "free_bytes": 1 * GB, "why": "no model loaded: nothing to overlap with"}


@pytest.mark.parametrize("requested", ["overlap", "drain"])
def test_an_explicit_policy_is_kept_even_when_it_does_not_fit(requested: str) -> None:
    chosen, why = choose_policy(requested, need=8 * GB, free=0, has_current=True)
    assert chosen == requested and why["why"] == f"reload_policy={requested}"


def test_auto_drains_when_free_memory_is_unknown() -> None:
    chosen, why = choose_policy("auto", need=1, free=0, has_current=True)
    assert chosen == "drain" and "unknown" in why["why"]


@pytest.mark.parametrize(("need", "free", "expected"), [
    (1 * GB, 2 * GB, "overlap"),
    (2 * GB, 2 * GB, "overlap"),  # exactly fits
    (2 * GB + 1, 2 * GB, "drain"),
])
def test_auto_overlaps_only_when_the_new_generation_fits(need: int, free: int, expected: str) -> None:
    chosen, why = choose_policy("auto", need=need, free=free, has_current=True)
    assert chosen == expected
    assert why["need_bytes"] == need and why["free_bytes"] == free
    assert ("does not fit" in why["why"]) == (expected == "drain")

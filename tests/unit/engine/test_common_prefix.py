"""``common_prefix`` (slot choice and prefix reuse) against the obvious element-by-element count."""

from __future__ import annotations

from array import array

from hypothesis import given, strategies as st

from hydrad.engine.tokenprefix import common_prefix


def _naive(a: list[int], b: list[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


tokens = st.lists(st.integers(0, 5), max_size=80)


@given(tokens, tokens, tokens)
def test_agrees_with_counting_one_by_one(shared: list[int], a_tail: list[int], b_tail: list[int]) -> None:
    a, b = shared + a_tail, shared + b_tail
    assert common_prefix(a, b) == _naive(a, b) >= len(shared)
    assert common_prefix(b, a) == common_prefix(a, b)


def test_edges_and_mixed_sequence_types() -> None:
    assert common_prefix([], [1, 2]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([9, 2], [1, 2]) == 0
    long = list(range(5000))
    assert common_prefix(long, long[:4999] + [-1]) == 4999
    assert common_prefix(tuple(long[:10]), long) == 10
    assert common_prefix(array("i", long[:7]), long[:7] + [3]) == 7

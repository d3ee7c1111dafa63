"""64-bit seeds: every bit counts, and 32-bit seeds stay llama-server's."""

from __future__ import annotations

from hydrad.engine.sampling import fold_seed


def test_seeds_below_two_to_the_32_are_kept() -> None:
    for seed in (0, 1, 42, 2**31, 2**32 - 1):
        assert fold_seed(seed) == seed


def test_high_bits_make_another_seed_within_32_bits() -> None:
    folded = {fold_seed(5 + k * 2**32) for k in range(1, 200)}
    assert len(folded) == 199 and fold_seed(5) not in folded
    assert all(0 <= f < 2**32 for f in folded) and fold_seed(2**64 - 1) < 2**32
    assert fold_seed(7 + 2**40) == fold_seed(7 + 2**40)

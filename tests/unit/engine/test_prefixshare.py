"""When an engine restores a stored prefix rather than prefilling it: only while restoring is measured
to be faster (hydrad/engine/prefixshare.py). Pure decision logic, no model needed."""

from __future__ import annotations

from hydrad.engine.prefixshare import LONG_PREFILL, PrefixShare
from hydrad.engine.settings import PrefixSettings


def test_restores_until_both_rates_are_known_then_only_when_faster() -> None:
    p = PrefixShare(PrefixSettings())
    assert not p._prefill_is_faster(2048)  # nothing measured yet: try the restore
    p.prefill_seen(LONG_PREFILL - 1, 10.0)  # a short prefill says nothing about the rate
    p._restore_spt = 40e-6
    assert not p._prefill_is_faster(2048)
    p.prefill_seen(2400, 2400 * 30e-6)  # a fast GPU: 30 µs per token against 40 µs per restored token
    skipped = [p._prefill_is_faster(2048) for _ in range(64)]
    assert skipped.count(False) == 2  # every 32nd decision restores anyway, to keep the restore rate current
    assert p.stats["store_slower_skipped"] == 62
    p.prefill_seen(2400, 2400 * 4e-3)  # a CPU: milliseconds per token
    assert not p._prefill_is_faster(2048)
    p.close()

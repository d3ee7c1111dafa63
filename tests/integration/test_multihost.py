"""The pool across hosts, on the multi-host test bed: the coordinator and two engines each in a network
namespace of its own, joined by a bridge, every link 20 ms ± 5 ms each way (``tc netem``, else a TCP
relay per link), partitions scripted. Needs root and ``ip netns``; skipped with the reason elsewhere.

What tests/integration/test_faults.py already proves (an engine cut off for 4 s behind a veth of its own
is routed around and re-admitted, with the coordinator on loopback) is not repeated; these add the
coordinator on a host of its own, link latency, steady concurrent streaming load across the cut with the
answers checked for loss and duplication, one registration after the healing, and the coordinator's
own partition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import bedscenarios as B
from tests.support.faultpool import ENGINES, FaultPool
from tests.support.netpartition import Bed, PartitionUnavailable

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def bed_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultPool, Bed]]:
    from tests.conftest import _need
    from tests.support.engine import SMOLLM
    _need(SMOLLM)
    try:
        bed = Bed(["coordinator", *ENGINES], n=3, delay_ms=20, jitter_ms=5)
    except PartitionUnavailable as exc:
        pytest.skip(str(exc))
    pool = FaultPool(tmp_path_factory.mktemp("bed"), n_parallel=2, bed=bed)
    try:
        pool.start()
        yield pool, bed
    finally:
        pool.close()
        bed.close()


def _passed(r: B.Result) -> None:
    print(json.dumps({"name": r.name, "passed": r.passed, "figures": r.figures, "failures": r.failures}, indent=1))
    assert r.passed, r.failures


def test_an_engine_cut_off_for_10s_under_load_loses_and_duplicates_nothing(bed_pool: tuple[FaultPool, Bed]) -> None:
    pool, bed = bed_pool
    r = B.engine_cut_under_load(pool, bed, cut_s=10.0)
    _passed(r)
    assert r.figures["shaping"] in ("netem", "relay")
    assert r.figures["requests"].get("complete (cut)", 0) >= 3, r.figures


def test_a_coordinator_cut_off_leaves_the_engines_serving_their_direct_clients(bed_pool: tuple[FaultPool, Bed],
                                                                               tmp_path: Path) -> None:
    pool, bed = bed_pool
    r = B.coordinator_cut(pool, bed, cut_s=10.0)
    _passed(r)
    assert all(r.figures["direct_requests"].get(f"{n} complete", 0) >= 2 for n in ENGINES), r.figures

"""The reliability program in small (scripts/reliability --quick runs more of each): real faults
against a real pool of a coordinator and two SmolLM2 engines, restarted on the same config and ports
as systemd's Restart= would.

Not repeated here, because tests/integration/test_coordinator.py already checks them on one fault
each: the retry of a request whose engine died before its first token, the error event of one killed
mid-stream, and SIGSTOP past the heartbeat timeout with re-admission after SIGCONT. What is new:
repeated kills, each followed by the pool coming back; the coordinator killed with SIGKILL mid-stream
and the engines re-registering; kills landing on the coordinator's Store writes and on STATE_PUT; an
engine killed mid-reload (a profile switch) and given the active profile back when it registers again;
the source, the destination or the coordinator killed mid-migration of a session; a flood of
connections at the merged port; and an engine cut off by a network partition (a veth link of its own,
taken down and up)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.support import faultscenarios as S
from tests.support.faultpool import PROFILE, FaultPool

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultPool]:
    from tests.conftest import _need
    from tests.support.engine import SMOLLM
    _need(SMOLLM)
    p = FaultPool(tmp_path_factory.mktemp("faults"))
    try:
        p.start()
        yield p
    finally:
        p.close()


def _passed(r: S.Result) -> None:
    assert r.passed, f"{r.name}: {r.failures}\n{r.figures}"


def test_engines_killed_mid_stream_end_cleanly_and_the_pool_comes_back(pool: FaultPool) -> None:
    r = S.engine_kills(pool, 4)  # the fourth is killed mid-prefill: retried on the other engine
    _passed(r)
    f = r.figures
    assert f["kills"] == 4 and f["pool_back"] == 4 and f["hangs"] == 0 and f["garbled"] == 0
    assert f["coordinator_crashes"] == 0
    assert f["killed_stream"].get("clean_error", 0) >= 1  # after a token: an error event, then [DONE]


def test_coordinator_killed_mid_stream_engines_serve_and_reregister(pool: FaultPool) -> None:
    r = S.coordinator_kills(pool, 1)
    _passed(r)
    assert r.figures["own_door_status"] == {200: 2}
    assert r.figures["client"].get("hang", 0) == 0


def test_kills_during_store_writes_and_state_put_corrupt_nothing(pool: FaultPool) -> None:
    r = S.store_kills(pool, 4)
    _passed(r)
    st = r.figures["store"]
    assert st["objects"] >= 1 and st["bad_chunks"] == 0 and st["bad_manifests"] == 0
    assert st["index_unreadable"] == 0
    assert r.figures["final_turns"] == {200: 3}


def test_engines_killed_mid_reload_get_the_active_profile_back(pool: FaultPool) -> None:
    """Three profile switches (a model load on both engines), one engine killed early, mid and late in
    its load: the switch answers 502 naming it, the clients' streams end cleanly, and the restarted
    engine serves the profile the coordinator reports as active."""
    r = S.reload_kills(pool, 3)
    _passed(r)
    f = r.figures
    assert f["kills"] == 3 and f["victim_load_interrupted"] >= 2, f
    assert f["switch_status"].get("502", 0) >= 2 and f["hangs"] == 0 and f["coordinator_crashes"] == 0
    assert f["serving_active_profile_again"] == 3
    assert sum(f["client_streams"].values()) == 9 and set(f["client_streams"]) <= {"complete", "clean_error"}
    assert pool.active_profile() == PROFILE and all(pool.serves_profile(e, PROFILE) for e in pool.engines)


def test_kills_mid_session_move_leave_the_store_whole_and_the_session_answering(pool: FaultPool) -> None:
    """A session moved between the engines three times; each move the source, the destination, then the
    coordinator is killed: every move answers or (the coordinator killed) drops, the session's next turn
    answers every time, and the Store verifies."""
    r = S.move_kills(pool, 3)
    _passed(r)
    f = r.figures
    assert f["killed"] == {"source": 1, "destination": 1, "coordinator": 1}
    assert f["next_turn"] == {"200": 3} and f["pool_back"] == 3
    assert f["store"]["objects"] >= 1 and f["corrupt_objects"] == 0 and f["store"]["index_unreadable"] == 0
    assert "hang" not in f["move_status"]


def test_an_engine_killed_inside_a_state_stream_is_a_lost_connection_to_its_reader(pool: FaultPool) -> None:
    """The source of a move killed while its slot's state streams out: the reader (the coordinator's move,
    keep or restore; hydractl) gets a ConnectionError, which each of them handles, not the wire decoder's
    ProtocolError for the frame cut short (that one escaped the move, which answered 500 instead of
    restoring the session from the Store)."""
    from hydrad.wire.rpcclient import RpcClient
    system = "Session cut. " + " ".join(f"Rule {k}: answer item {k} in one word." for k in range(100))
    status, body = S._session_turn(pool, "cut", [{"role": "system", "content": system},
                                                 {"role": "user", "content": "Item 1?"}], 120)
    assert status == 200, body
    engine = body["_engine"]
    with RpcClient(pool.engines_view()[engine]["rpc"]) as c:
        slot = max(c.info()["slots"], key=lambda s: s.get("n_tokens") or 0)
        assert slot["n_tokens"] >= 1000, slot  # about 32 MB of KV: far more than the sockets buffer
        chunks = iter(c.state_get(int(slot["id"])).chunks)
        assert len(next(chunks)) > 0
        before = pool.instances()
        pool.engines[engine].kill9()
        with pytest.raises(ConnectionError):
            for _ in chunks:
                pass
    pool.engines[engine].start()
    pool.wait_pool(120, not_instances={engine: before[engine]})


def test_a_flood_of_control_connections_leaves_the_engine_serving(pool: FaultPool) -> None:
    # 200 connections in 1 s; the latency goal is the full run's (on shared CI cores it is noise)
    r = S.control_flood(pool, rate=200, seconds=1, latency_goal=False)
    _passed(r)
    out = r.figures["attack"]["outcomes"]
    assert sum(out.values()) >= 190
    assert out.get("info:ok", 0) >= 1
    assert not [k for k in out if k.split(":")[1] not in ("ok", "busy", "closed", "error_status")], out


def test_an_engine_cut_off_by_a_network_partition_is_routed_around_and_readmitted(tmp_path: Path) -> None:
    """rel-a in a network namespace of its own, its veth link cut for 4 s: marked dead within 3 heartbeat
    intervals, every request meanwhile served by rel-b, back within 2 intervals of the link's healing."""
    from tests.conftest import _need
    from tests.support.engine import SMOLLM
    from tests.support.netpartition import NetLink, PartitionUnavailable
    _need(SMOLLM)
    try:
        link = NetLink(2)
    except PartitionUnavailable as exc:
        pytest.skip(str(exc))
    p = FaultPool(tmp_path, isolate={"rel-a": link})
    try:
        p.start()
        r = S.partitions(p, "rel-a", link, rounds=1, cut_s=4)
        _passed(r)
        assert r.figures["requests_meanwhile"].get("200 by the other", 0) >= 1
    finally:
        p.close()
        link.close()


def test_a_bus_flood_from_strangers_leaves_the_pool_registered_and_serving(pool: FaultPool) -> None:
    """8 peers at the coordinator's ROUTER for 3 s: fuzzed bus messages, forged engine identities,
    token-less REGISTERs, oversized frames. Both engines stay registered, the front door keeps answering
    (the latency goal is the full run's: on shared CI cores it is noise), strangers get few answers."""
    r = S.bus_flood(pool, seconds=3, latency_goal=False)
    _passed(r)
    assert r.figures["attack"]["messages"] > 1000, r.figures["attack"]
    assert r.figures["probes"][1] >= 1, "no front-door request was answered during the flood"
    assert r.figures["attack"]["answers"].get("REREGISTER", 0) <= 8 * 3 / 0.5 + 8, r.figures["attack"]["answers"]

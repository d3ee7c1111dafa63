"""COMBINE pairs as the coordinator shows and routes them: every engine's own report (mode, role,
peers, serving) named by the RPC addresses engines registered, the model-less peer that is no
routing target, and a head's memory counted with its peers'. Records are built directly; no bus."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hydrad.cli.ctl.coordinator import _plain, format_engines
from hydrad.coordinator.frontdoor import FrontDoor
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.coordinator.records import EngineRecord, Pair, pairs
from hydrad.coordinator.routing import EngineView, ModelSpec, RouteRequest, route
from hydrad.wire import messages as M

GIB = 1 << 30


def record(name: str, rpc: str | None = None, *, alive: bool = True, vram: int = 0, **status: Any) -> EngineRecord:
    gpu = M.GpuInfo(kind="gpu" if vram else "cpu", vram_total=vram, vram_free=vram)
    info = M.Register(engine=name, instance="p.1", version="t", rpc=rpc, gpu=gpu, models_on_disk=["m", "big"])
    return EngineRecord(name=name, info=info, status=M.EngineStatus(**status), alive=alive)


def head(name: str, rpc: str, *peers: str, **kw: Any) -> EngineRecord:
    return record(name, rpc, stage="ready", model="m", mode="combine", role="head", peers=list(peers), **kw)


def peer(name: str, rpc: str, *serving: str, **kw: Any) -> EngineRecord:
    role = "peer" if serving else "solo"
    return record(name, rpc, stage="idle", mode="combine" if serving else "solo", role=role, serving=list(serving),
                  **kw)


def by_name(*recs: EngineRecord) -> dict[str, EngineRecord]:
    return {r.name: r for r in recs}


# ----- the pair by name ------------------------------------------------------------------


def test_a_head_and_its_peer_name_each_other() -> None:
    es = by_name(head("5060ti", "10.0.0.1:50052", "10.0.0.2:50052"), peer("p100", "10.0.0.2:50052", "10.0.0.1:41234"),
                 record("3060", "10.0.0.3:50052", stage="ready", model="m"))
    got = pairs(es)
    assert got["5060ti"] == Pair(peers=("p100",), heads=())
    assert got["p100"] == Pair(peers=(), heads=("5060ti",))
    assert got["3060"] == Pair()
    assert got["5060ti"].public() == {"pair": ["p100"], "pair_peers": ["p100"], "pair_heads": []}
    assert got["p100"].public() == {"pair": ["5060ti"], "pair_peers": [], "pair_heads": ["5060ti"]}


def test_unknown_endpoints_stay_addresses() -> None:
    """A peer no engine registered (llama.cpp's rpc-server, say), and a peer whose head is not
    registered here: the addresses the engines report."""
    es = by_name(head("h", "127.0.0.1:9001", "10.9.9.9:50052"), peer("p", "127.0.0.1:9002", "10.0.0.7:40000"))
    got = pairs(es)
    assert got["h"].peers == ("10.9.9.9:50052",)
    assert got["p"].heads == ("10.0.0.7:40000",)


def test_addresses_match_across_loopback_spellings_and_wildcards() -> None:
    es = by_name(head("h", "127.0.0.1:9001", "localhost:9002", "[::1]:9003", "192.168.1.5:9004"),
                 peer("a", "127.0.0.1:9002", "127.0.0.1:1"), peer("b", "::1:9003", "127.0.0.1:2"),
                 peer("c", "0.0.0.0:9004", "192.168.1.4:3"))
    got = pairs(es)
    assert got["h"].peers == ("a", "b", "c")
    assert got["a"].heads == got["b"].heads == got["c"].heads == ("h",)


def test_a_dead_head_is_no_peers_head_and_a_live_engine_owns_a_reused_address() -> None:
    es = by_name(head("old", "127.0.0.1:9001", "127.0.0.1:9002", alive=False),
                 peer("gone", "127.0.0.1:9002", alive=False), peer("p", "127.0.0.1:9002"),
                 head("new", "127.0.0.1:9003", "127.0.0.1:9002"))
    got = pairs(es)
    assert got["old"].peers == ("p",) and got["new"].peers == ("p",)
    assert got["p"].heads == ("new",)  # the dead head's last report does not count
    assert got["gone"].heads == ()


def test_head_and_peer_at_once() -> None:
    es = by_name(head("a", "127.0.0.1:1", "127.0.0.1:2"),
                 record("b", "127.0.0.1:2", stage="ready", model="m", mode="combine", role="head+peer",
                        peers=["127.0.0.1:3"], serving=["127.0.0.1:5555"]),
                 peer("c", "127.0.0.1:3", "127.0.0.1:6666"))
    got = pairs(es)
    assert got["b"] == Pair(peers=("c",), heads=("a",))
    assert got["b"].names == ["c", "a"]


# ----- hydractl engines ------------------------------------------------------------------


def _admin_doc(es: dict[str, EngineRecord]) -> dict[str, Any]:
    """What GET /admin/engines answers for these records (the admin route's own composition)."""
    paired = pairs(es)
    return {"profile": "pair", "engines": [{**r.public(), **paired[n].public()} for n, r in sorted(es.items())]}


def test_hydractl_engines_mode_column() -> None:
    es = by_name(head("5060ti", "10.0.0.1:50052", "10.0.0.2:50052"), peer("p100", "10.0.0.2:50052", "10.0.0.1:4"),
                 record("3060", "10.0.0.3:50052", stage="ready", model="m"))
    doc = _admin_doc(es)
    text = format_engines(doc, "http://c:9000")
    header, *rows = text.splitlines()[1:]
    assert "mode" in header.split()
    col = header.index(" mode ") + 1
    cells = {r.split()[0]: r[col:].split("  ")[0] for r in rows}
    assert cells == {"3060": "SOLO", "5060ti": "COMBINE head→p100", "p100": "COMBINE peer←5060ti"}, text
    assert "COMBINE head->p100" in _plain(text, "ascii") and "peer<-5060ti" in _plain(text, "ascii")
    assert _plain(text, "utf-8") == text
    # an older coordinator without the names: the engines' own addresses
    for e in doc["engines"]:
        for key in ("pair", "pair_peers", "pair_heads"):
            e.pop(key)
    text = format_engines(doc, "http://c:9000")
    assert "COMBINE head→10.0.0.2:50052" in text and "COMBINE peer←10.0.0.1:4" in text


# ----- routing -----------------------------------------------------------------------------


def _front(es: dict[str, EngineRecord]) -> FrontDoor:
    bus = SimpleNamespace(engines=es, listeners=[], inflight=lambda name: 0, inflight_total=lambda: 0)
    switcher = SimpleNamespace(locked=lambda name: False, placed=lambda name: (False, None))
    settings = CoordinatorSettings(load_on_demand=True)
    return FrontDoor(settings, bus, switcher, SimpleNamespace(entries={}))  # type: ignore[arg-type]


def test_a_model_less_peer_is_no_routing_target() -> None:
    """The peer has the model on disk and is idle: without its role it would be offered a load."""
    es = by_name(head("h", "127.0.0.1:1", "127.0.0.1:2", slots_total=1), peer("p", "127.0.0.1:2", "127.0.0.1:9"))
    views = {v.name: v for v in _front(es).views(model="big")}
    assert views["p"].role == "peer" and views["p"].lends_only and "big" in views["p"].models_on_disk
    d = route(RouteRequest(model="big", prompt_tokens=10), list(views.values()), {})
    assert d.engine == "h"
    assert d.rejected["p"].startswith("filter: a COMBINE peer")
    # the same engine lending nothing is an ordinary idle engine again
    es["p"] = peer("p", "127.0.0.1:2")
    views = {v.name: v for v in _front(es).views(model="big")}
    assert not views["p"].lends_only


def test_a_peer_serving_its_own_model_still_serves_it() -> None:
    both = EngineView(name="b", alive=True, stage="ready", model="m", models_on_disk=frozenset({"m"}), slots_busy=0,
                      slots_total=1, queued=0, role="peer")
    assert not both.lends_only
    assert route(RouteRequest(model="m", prompt_tokens=10), [both], {}).engine == "b"


def test_a_heads_memory_is_its_own_plus_its_peers() -> None:
    es = by_name(head("h", "127.0.0.1:1", "127.0.0.1:2", vram=8 * GIB, slots_total=1),
                 peer("p", "127.0.0.1:2", "127.0.0.1:9", vram=16 * GIB))
    views = {v.name: v for v in _front(es).views()}
    assert views["h"].vram_total == 24 * GIB and views["h"].vram_free == 24 * GIB
    assert views["p"].vram_total == 16 * GIB  # a peer counts only its own
    big = {"big": ModelSpec("big", size_bytes=20 * GIB, kv_bytes_per_token=0)}
    assert route(RouteRequest(model="big", prompt_tokens=1, n_ctx=0), list(views.values()), big).engine == "h"
    # a dead peer lends nothing; a peer of unknown size (CPU, or not registered) makes the pair unknown
    es["p"].alive = False
    assert {v.name: v for v in _front(es).views()}["h"].vram_total == 8 * GIB
    es["p"] = peer("p", "127.0.0.1:2", "127.0.0.1:9")
    assert {v.name: v for v in _front(es).views()}["h"].vram_total == 0
    es["h"] = head("h", "127.0.0.1:1", "10.9.9.9:2", vram=8 * GIB)
    assert {v.name: v for v in _front(es).views()}["h"].vram_total == 0

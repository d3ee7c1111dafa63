"""Clients take turns in an engine's queue, each client's own requests in their order."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from hydrad.engine.batching import in_turns
from hydrad.wire import messages as M
from hydrad.wire.requests import GenRequest


def _queue(*clients: str) -> deque[Any]:
    return deque(SimpleNamespace(request=GenRequest(prompt=f"{c}{i}", client=c), n=f"{c}{i}")
                 for i, c in enumerate(clients))


def test_a_flood_from_one_client_lets_another_in_at_once() -> None:
    q = _queue(*["greedy"] * 26, "polite", "polite")
    order = [h.request.client for h in in_turns(q)]
    assert order[:4] == ["greedy", "polite", "greedy", "polite"] and order.count("greedy") == 26
    greedy = [h.n for h in in_turns(q) if h.request.client == "greedy"]
    assert greedy == [h.n for h in q if h.request.client == "greedy"]  # a client's own order is kept


def test_one_client_keeps_its_queue() -> None:
    q = _queue("a", "a", "a")
    assert in_turns(q) is q


def test_the_client_travels_on_the_bus_and_is_kept_apart_from_the_engines_own() -> None:
    msg = M.Generate.from_request("gen-1", GenRequest(prompt="x", client="key:0123456789abcdef"), "m")
    again = M.decode(M.encode(msg))
    assert isinstance(again, M.Generate) and again.client == "key:0123456789abcdef"
    assert again.to_request().client == "bus:key:0123456789abcdef"
    assert b"client" not in M.encode(M.Generate.from_request("gen-2", GenRequest(prompt="x"), None))[2]

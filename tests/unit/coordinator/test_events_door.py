"""The coordinator's events socket admits only subscribers that present the events token, and what it
publishes names sessions by a keyed hash, never by their ids. A real CoordinatorBus (its XPUB and ZAP
handler) and real SUB sockets on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import zmq
import zmq.asyncio

from hydrad.common import tokenfile
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.eventsdoor import EventsDoor
from hydrad.coordinator.settings import CoordinatorSettings
from hydrad.wire import eventsauth

TOKEN = tokenfile.new_token()


def _subscriber(ctx: zmq.asyncio.Context, endpoint: str, token: str | None, curve: str | None = None,
                plain_user: bytes | None = None) -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    if plain_user is not None:  # PLAIN with another user name than the coordinator's
        sub.setsockopt(zmq.PLAIN_USERNAME, plain_user)
        sub.setsockopt(zmq.PLAIN_PASSWORD, (token or "").encode())
    else:
        eventsauth.present(sub, token, curve)
    sub.connect(endpoint)
    return sub


async def _drain(sub: zmq.asyncio.Socket, wait_ms: int = 300) -> list[list[bytes]]:
    got = []
    while await sub.poll(wait_ms):
        got.append(await sub.recv_multipart())
    return got


def _scenario(curve: tuple[str, str] | None) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        bus_cfg: dict[str, Any] = {"endpoint": "tcp://127.0.0.1:*", "request_stream": "off"}
        if curve is not None:
            bus_cfg.update(curve_public_key=curve[0], curve_secret_key=curve[1])
        bus = CoordinatorBus(CoordinatorSettings(bus=bus_cfg, events="tcp://127.0.0.1:*"), version="test")
        bus.events_door = EventsDoor(TOKEN)
        bus.start()
        ctx = zmq.asyncio.Context()
        server_key = curve[0] if curve is not None else None
        try:
            good = _subscriber(ctx, bus.events_endpoint, TOKEN, server_key)
            strangers = {"none": _subscriber(ctx, bus.events_endpoint, None, server_key),
                         "wrong": _subscriber(ctx, bus.events_endpoint, tokenfile.new_token(), server_key)}
            if curve is None:
                strangers["other user"] = _subscriber(ctx, bus.events_endpoint, TOKEN, plain_user=b"root")
            else:  # a subscriber that ignores CURVE altogether
                strangers["no curve"] = _subscriber(ctx, bus.events_endpoint, TOKEN)
            for _ in range(300):  # the good subscription reaches the XPUB asynchronously
                if bus._listened():
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # the strangers' handshakes have had their time too
            for i in range(5):
                bus.publish("route", req=f"r{i}", session="conversation-of-alice", engine="e",
                            reason="session conversation-of-alice is warm on e")
            got = {"good": await _drain(good)}
            for name, sub in strangers.items():
                got[name] = await _drain(sub, 100)
            return {"got": got, "refused": bus.events_door.refused, "subscriptions": bus._subscriptions}
        finally:
            ctx.destroy(0)
            await bus.close()

    return asyncio.run(run())


def test_only_a_subscriber_with_the_token_receives_events() -> None:
    out = _scenario(None)
    got = out["got"]
    assert [json.loads(f[1])["data"]["req"] for f in got["good"]] == [f"r{i}" for i in range(5)]
    assert got["none"] == got["wrong"] == got["other user"] == []
    assert out["refused"] >= 2  # the wrong token and the other user (no token at all fails PLAIN before ZAP)
    assert out["subscriptions"] == 1  # a refused peer's subscription never reached the socket


def test_under_curve_the_key_pair_comes_from_the_token() -> None:
    public, secret = (k.decode() for k in zmq.curve_keypair())
    out = _scenario((public, secret))
    got = out["got"]
    assert len(got["good"]) == 5
    assert got["none"] == got["wrong"] == got["no curve"] == []
    assert out["refused"] >= 2  # a random key pair and another token's


def test_no_session_id_is_published() -> None:
    frames = _scenario(None)["got"]["good"]
    assert frames and all(b"conversation-of-alice" not in part for f in frames for part in f)
    tags = {json.loads(f[1])["data"]["session"] for f in frames}
    assert len(tags) == 1  # one session, one tag, stable while the coordinator runs
    tag = tags.pop()
    assert tag.startswith("s-") and all(json.loads(f[1])["data"]["reason"] == f"session {tag} is warm on e"
                                        for f in frames)


def test_session_tags_are_keyed() -> None:
    a, b = EventsDoor(TOKEN), EventsDoor(TOKEN)
    assert a.session_tag("x") == a.session_tag("x") != a.session_tag("y")
    assert a.session_tag("x") != b.session_tag("x")  # another run, another key: no table of guesses carries over
    scrubbed = a.scrub({"session": "x", "candidates": [{"why": "session x"}], "n": 1})
    assert scrubbed == {"session": a.session_tag("x"), "candidates": [{"why": f"session {a.session_tag('x')}"}], "n": 1}
    assert a.scrub({"engine": "e"}) == {"engine": "e"}

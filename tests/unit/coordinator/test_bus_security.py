"""The coordinator's bus against hostile or broken peers: a real ROUTER on loopback and real
DEALERs standing in for engines (no model needed).

- a REGISTER without the pool's token (or with another) is answered REFUSED and gets no traffic;
- a peer claiming an admitted engine's name never receives that engine's requests;
- a request that cannot be encoded (a lone surrogate) or is too large for the bus leaves no
  in-flight entry behind (68 of them once made an idle engine look full for good);
- an engine reporting stage ``failed`` (its engine thread died) fails its requests at once and
  routing stops choosing it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import zmq
import zmq.asyncio

from hydrad.common import tokenfile
from hydrad.wire import messages as M
from hydrad.coordinator.bus import CoordinatorBus, EngineLost, RequestUnsendable
from hydrad.coordinator.settings import CoordinatorSettings
from tests.support.wait import eventually_async

TOKEN = "t0ken-for-the-unit-tests-0123456789"


async def _until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    await eventually_async(cond, timeout, what, interval=0.005)


class _Peer:
    """A DEALER on the coordinator's bus with a chosen identity."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, ident: bytes) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, ident)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    async def send(self, msg: Any) -> None:
        await self.sock.send_multipart(M.encode(msg))

    async def recv(self, timeout: float = 3.0) -> Any:
        return M.decode(await asyncio.wait_for(self.sock.recv_multipart(), timeout))

    async def recv_kind(self, kind: type, timeout: float = 3.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if isinstance(msg, kind):
                return msg

    async def drain(self, seconds: float) -> list[Any]:
        """Every message that arrives within ``seconds``."""
        out: list[Any] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if await self.sock.poll(int(left * 1000) + 1):
                out.append(M.decode(await self.sock.recv_multipart()))
        return out


def _register(name: str, token: str | None, instance: str = "i.1") -> M.Register:
    return M.Register(engine=name, instance=instance, version="t", pid=1, heartbeat_interval_s=60,
                      status=M.EngineStatus(stage="ready", model="m", slots_total=1), token=token)


async def _with_bus(tmp: Path, body: Callable[[CoordinatorBus, zmq.asyncio.Context], Any], *,
                    token: bool = True) -> Any:
    extra: dict[str, Any] = {}
    if token:
        path = tmp / "bus.token"
        tokenfile.write_token(path, TOKEN)
        extra["bus_token_file"] = path
    settings = CoordinatorSettings(bus={"endpoint": "tcp://127.0.0.1:*"}, events="tcp://127.0.0.1:*", **extra)
    bus = CoordinatorBus(settings, version="test")
    bus.load_token()
    bus.start()
    ctx = zmq.asyncio.Context()
    try:
        return await body(bus, ctx)
    finally:
        ctx.destroy(0)
        await bus.close()


def test_register_needs_the_pool_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tokenfile.ENV_BUS_TOKEN_FILE, raising=False)

    async def body(bus: CoordinatorBus, ctx: zmq.asyncio.Context) -> None:
        anon = _Peer(ctx, bus.bus_endpoint, b"anon~1")
        await anon.send(_register("anon", None))
        refused = await anon.recv_kind(M.Refused)
        assert "needs a token" in refused.reason
        wrong = _Peer(ctx, bus.bus_endpoint, b"wrong~1")
        await wrong.send(_register("wrong", "x" * 32))
        assert "wrong bus token" in (await wrong.recv_kind(M.Refused)).reason
        assert bus.engines == {}
        # Nothing else reaches a refused peer: no PING, no request, whatever it sends next.
        await anon.send(M.Heartbeat(status=M.EngineStatus(stage="ready", model="m")))
        later = await anon.drain(0.5)
        assert all(isinstance(m, (M.Reregister, M.Refused)) for m in later), later
        good = _Peer(ctx, bus.bus_endpoint, b"good~1")
        await good.send(_register("good", TOKEN))
        assert isinstance(await good.recv_kind(M.Welcome), M.Welcome)
        assert set(bus.engines) == {"good"} and bus.engines["good"].info.token is None  # the secret is not kept

    asyncio.run(_with_bus(tmp_path, body))


def test_a_peer_claiming_an_engines_name_gets_none_of_its_traffic(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tokenfile.ENV_BUS_TOKEN_FILE, raising=False)

    async def body(bus: CoordinatorBus, ctx: zmq.asyncio.Context) -> None:
        real = _Peer(ctx, bus.bus_endpoint, b"e1~aaaa")
        await real.send(_register("e1", TOKEN))
        await real.recv_kind(M.Welcome)
        # Same name, bare identity (ROUTER_HANDOVER would hand it a bare-named routing id) and another nonce.
        bare = _Peer(ctx, bus.bus_endpoint, b"e1")
        other = _Peer(ctx, bus.bus_endpoint, b"e1~bbbb")
        for p in (bare, other):
            await p.send(M.Heartbeat(status=M.EngineStatus(stage="ready", model="m")))
            await p.send(M.Done(req="gen-x-1", finish_reason="stop", usage=M.UsageInfo()))
            assert isinstance(await p.recv_kind(M.Reregister), M.Reregister)
            await p.send(_register("e1", None, instance="evil.1"))  # and no token to take the name over
            assert isinstance(await p.recv_kind(M.Refused), M.Refused)
        stream = bus.generate("e1", M.Generate(req="gen-t-1", prompt="secret prompt"))
        got = await real.recv_kind(M.Generate)
        assert got.prompt == "secret prompt"
        for p in (bare, other):
            assert not any(isinstance(m, M.Generate) for m in await p.drain(0.3))
        # A forged answer from the impostor does not reach the request; the real one does.
        await other.send(M.Tokens(req="gen-t-1", texts=["forged"]))
        await real.send(M.Tokens(req="gen-t-1", texts=["real"]))
        ev = await stream.next(3)
        assert isinstance(ev, M.Tokens) and ev.texts == ["real"]
        assert bus.engines["e1"].info.instance == "i.1" and bus.engines["e1"].alive

    asyncio.run(_with_bus(tmp_path, body))


def test_unsendable_requests_leave_nothing_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tokenfile.ENV_BUS_TOKEN_FILE, raising=False)

    async def body(bus: CoordinatorBus, ctx: zmq.asyncio.Context) -> None:
        e = _Peer(ctx, bus.bus_endpoint, b"e1~aaaa")
        await e.send(_register("e1", TOKEN))
        await e.recv_kind(M.Welcome)
        for i in range(68):
            with pytest.raises(RequestUnsendable) as bad:
                bus.generate("e1", M.Generate(req=f"gen-s-{i}", prompt="hi", stop=["\udfff"]))
            assert not bad.value.too_large
        with pytest.raises(RequestUnsendable) as big:
            bus.generate("e1", M.Generate(req="gen-big-1", prompt="x" * (M.MAX_BODY + 1)))
        assert big.value.too_large
        assert bus.inflight("e1") == 0 and bus.inflight_total() == 0
        assert not any(isinstance(m, M.Generate) for m in await e.drain(0.3))
        # The engine is still reachable and takes the next request.
        bus.generate("e1", M.Generate(req="gen-ok-1", prompt="fine"))
        assert (await e.recv_kind(M.Generate)).req == "gen-ok-1"
        assert bus.inflight("e1") == 1

    asyncio.run(_with_bus(tmp_path, body))


def test_an_engine_reporting_failed_fails_its_requests_at_once(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tokenfile.ENV_BUS_TOKEN_FILE, raising=False)

    async def body(bus: CoordinatorBus, ctx: zmq.asyncio.Context) -> None:
        e = _Peer(ctx, bus.bus_endpoint, b"e1~aaaa")
        await e.send(_register("e1", TOKEN))
        await e.recv_kind(M.Welcome)
        stream = bus.generate("e1", M.Generate(req="gen-f-1", prompt="hi"))
        await e.send(M.Heartbeat(status=M.EngineStatus(stage="failed", model="m", slots_total=1,
                                                       last_error="the engine thread died")))
        ev = await stream.next(3)
        assert isinstance(ev, EngineLost) and "engine thread died" in ev.reason
        assert bus.inflight("e1") == 0 and bus.engines["e1"].status.stage == "failed"

    asyncio.run(_with_bus(tmp_path, body))


def test_token_file_rules(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(tokenfile.TokenError, match="16 to 256"):
        tokenfile.read_token(short)
    with pytest.raises(tokenfile.TokenError, match="does not exist; create it with"):
        tokenfile.read_token(tmp_path / "missing")
    made = tmp_path / "made"
    token = tokenfile.write_token(made)
    assert tokenfile.read_token(made) == token and (made.stat().st_mode & 0o777) == 0o600
    assert tokenfile.same(token, token) and not tokenfile.same(None, token) and not tokenfile.same("\udfff", token)


def test_short_and_broken_messages_on_an_admitted_connection_are_dropped_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An admitted engine's own connection sending fewer frames than a message has, or junk: each is
    dropped as malformed (never a handler error), and the connection goes on serving its requests."""
    monkeypatch.delenv(tokenfile.ENV_BUS_TOKEN_FILE, raising=False)

    async def body(bus: CoordinatorBus, ctx: zmq.asyncio.Context) -> None:
        real = _Peer(ctx, bus.bus_endpoint, b"e1~aaaa")
        await real.send(_register("e1", TOKEN))
        await real.recv_kind(M.Welcome)
        stream = bus.generate("e1", M.Generate(req="gen-s-1", prompt="p"))
        await real.recv_kind(M.Generate)
        for frames in ([b""], [M.PROTOCOL], [M.PROTOCOL, b"TOKENS"], [M.PROTOCOL, b"REGISTER"], [b"x", b"y", b"z", b"w"]):
            await real.sock.send_multipart(frames)
        await real.send(M.Tokens(req="gen-s-1", texts=["still here"]))
        ev = await stream.next(3)
        assert isinstance(ev, M.Tokens) and ev.texts == ["still here"]
        assert bus.engines["e1"].alive

    with caplog.at_level("WARNING"):
        asyncio.run(_with_bus(tmp_path, body))
    assert "malformed bus message dropped" in caplog.text
    assert "handler failed" not in caplog.text, caplog.text

"""The heartbeat never waits for the device and weights figures it carries: a read of them that takes
longer than the coordinator's three intervals (a busy GPU, or Python work queued behind a large
request's own) once kept an engine silent until the coordinator declared it dead. A real link (its
own DEALER) against a real ROUTER on loopback standing in for the coordinator; the device read is
made slow."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from hydrad.common.registry import Registry
from hydrad.engine.bus import link as link_module
from hydrad.engine.bus.link import EngineLink
from hydrad.engine.control import EngineControl
from hydrad.engine.core import EngineCore
from hydrad.engine.settings import EngineSettings
from hydrad.wire import messages as M

INTERVAL = 0.2
SLOW_READ_S = 2.0


def test_heartbeats_go_on_while_the_device_figures_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[float] = []
    real = link_module.local_gpu

    def slow_local_gpu() -> M.GpuInfo:
        reads.append(time.monotonic())
        if len(reads) > 1:  # the first read (before REGISTER) is quick; every later one is slow
            time.sleep(SLOW_READ_S)
        return real()

    monkeypatch.setattr(link_module, "local_gpu", slow_local_gpu)
    monkeypatch.setattr(link_module, "REFRESH_S", 0.5)

    async def scenario() -> list[float]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        control = EngineControl(EngineCore(), Registry.load(None, Path(".")), {})
        link = EngineLink(EngineSettings(name="t", bus={"endpoint": f"tcp://127.0.0.1:{port}",
                                                        "heartbeat_interval_s": INTERVAL}),
                          control, http=None, rpc=None)
        runner = asyncio.create_task(link._run())
        beats: list[float] = []
        try:
            end = time.monotonic() + 2 * SLOW_READ_S + 1
            while time.monotonic() < end:
                if not await router.poll(100):
                    continue
                ident, *frames = await router.recv_multipart()
                msg = M.decode(frames)
                if isinstance(msg, M.Register):
                    answer: M.Message = M.Welcome(coordinator="test", version="0")
                else:
                    answer = M.Ping()
                    if isinstance(msg, M.Heartbeat):
                        beats.append(time.monotonic())
                await router.send_multipart([ident, *M.encode(answer)])
            return beats
        finally:
            await link._close("test over")
            runner.cancel()
            router.close(linger=0)
            ctx.term()

    beats = asyncio.run(scenario())
    assert len(reads) >= 2, "no slow read happened: the test proves nothing"
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert beats and max(gaps) < 2 * INTERVAL, f"a heartbeat waited {max(gaps):.2f} s for the device read"
    # and the reads did go on, one at a time: never a second while one was under way
    assert all(b - a >= SLOW_READ_S - 0.05 for a, b in zip(reads[1:], reads[2:])), reads

"""The preparation pool: small bodies inline, others on a worker while the loop keeps running, and a
client past its share refused while others are still served."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from hydrad.common.prepare import INLINE_BYTES, Preparer, client_key, light


class Refused(Exception):
    pass


def test_light_bodies_and_client_keys() -> None:
    assert light(b'{"messages": []}')
    assert not light(b"x" * INLINE_BYTES)
    assert not light(b'{"tools": []}') and not light(b'{"response_format": {}}')
    def req(host: str | None, auth: str = "") -> SimpleNamespace:
        return SimpleNamespace(client=SimpleNamespace(host=host) if host else None, headers={"authorization": auth})

    assert client_key(req("1.2.3.4")) == "addr:1.2.3.4" and client_key(req(None)) == "addr:?"
    # a header names no one: with no key (or one shared key) a client could take a new name per request
    assert client_key(req("1.2.3.4", "Bearer a")) == client_key(req("1.2.3.4", "Bearer b"))


def test_heavy_work_leaves_the_loop_free_and_light_work_stays_inline() -> None:
    prep = Preparer(Refused, workers=2, per_client=2)
    threads: list[str] = []

    def job(raw: bytes) -> int:
        threads.append(threading.current_thread().name)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:  # Python work that holds the interpreter lock
            sum(range(1000))
        return len(raw)

    async def main() -> float:
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.005)

        t = asyncio.create_task(ticker())
        assert await prep.run("a", b'{"tools": 1}', job, b'{"tools": 1}') == 12
        t.cancel()
        assert await prep.run("a", b"{}", lambda raw: threading.current_thread().name, b"{}") == "MainThread"
        return max(b - a for a, b in zip(ticks, ticks[1:]))

    longest = asyncio.run(main())
    assert threads and threads[0].startswith("hydra-prep-"), threads
    assert longest < 0.1, f"the loop waited {longest * 1000:.0f} ms while a 300 ms job ran"
    prep.close()


def test_clients_take_turns_on_the_workers() -> None:
    prep = Preparer(Refused, workers=1, per_client=64)
    order: list[str] = []
    gate = threading.Event()

    def job(who: str) -> str:
        gate.wait(5)
        order.append(who)
        return who

    async def main() -> None:
        heavy = b"x" * INLINE_BYTES
        tasks = [asyncio.create_task(prep.run("greedy", heavy, job, "greedy")) for _ in range(10)]
        await asyncio.sleep(0.05)
        tasks.append(asyncio.create_task(prep.run("polite", heavy, job, "polite")))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order.index("polite") <= 2, order  # after the greedy job running and at most one more
    prep.close()


def test_a_client_past_its_share_gets_refused_and_others_go_on() -> None:
    prep = Preparer(Refused, workers=4, per_client=2)
    gate = threading.Event()

    def slow(raw: bytes) -> bytes:
        gate.wait(5)
        return raw

    async def main() -> None:
        heavy = b"x" * INLINE_BYTES
        held = [asyncio.create_task(prep.run("greedy", heavy, slow, heavy)) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert prep.pending("greedy") == 2
        with pytest.raises(Refused, match="at most 2"):
            await prep.run("greedy", heavy, slow, heavy)
        other = asyncio.create_task(prep.run("polite", heavy, slow, heavy))
        await asyncio.sleep(0.05)
        gate.set()
        assert await other == heavy and all(r == heavy for r in await asyncio.gather(*held))
        assert prep.pending("greedy") == 0 and prep.pending("polite") == 0

    asyncio.run(main())
    prep.close()

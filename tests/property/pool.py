"""The two doors under test: a hydrad engine serving SmolLM2-135M, and a pool (hydra-coordinator +
one hydrad engine on the bus) behind the front door. Used by the property tests' fixtures and by
``scripts/fuzz_doors.py``.

Every process runs under an address-space limit (``HYDRA_PROPERTY_AS_LIMIT`` bytes, default
8 GiB): a request that makes a daemon allocate without bound kills that daemon, not the
machine. A door whose process died or whose engine thread is dead is restarted before the next
example (:meth:`Door.heal`), so one engine-killing body fails one example, not every later one.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable

import httpx

from tests.property import doors
from tests.support.coordinator import Coordinator
from tests.support.engine import Engine, address_space_limit

MkTemp = Callable[[str], Path]


def _as_limit() -> int:
    """The limit asked for, never above the hard limit this process already runs under (a run under
    ``prlimit --as=...`` keeps its bound)."""
    wanted = int(os.environ.get("HYDRA_PROPERTY_AS_LIMIT", 8 << 30))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


AS_LIMIT = _as_limit()
# One thread each (CI machines have few cores). A small context bounds every answer: a request
# without a limit, or with a huge one, ends when the context is full, which takes seconds here.
# Embeddings on (a small second context), so that the embedding endpoints are served at both doors.
ENGINE_DEFAULTS = {"n_ctx": 512, "n_parallel": 2, "n_threads": 1, "embeddings": True, "pooling": "mean"}
INTERVAL = 0.5
POOL_ENGINE = "prop-a"
PROFILES = {"profiles": {"prop": {"description": "one SmolLM2 engine",
                                  "engines": {POOL_ENGINE: {"model": doors.MODEL, "params": ENGINE_DEFAULTS}}}},
            "default": "prop"}


class Door:
    """A door under test: where to send requests, which engines and coordinator to check after."""

    name = ""
    url = ""
    admin_url: str | None = None

    def __init__(self, mktemp: MkTemp) -> None:
        self._mktemp = mktemp
        self.client = httpx.Client(timeout=doors.CLIENT_TIMEOUT)
        self.restarts = 0

    def engine_urls(self) -> list[str]:
        raise NotImplementedError

    def exited(self) -> list[str]:
        """Processes of this door that exited."""
        raise NotImplementedError

    def healthy(self) -> bool:
        if self.exited():
            return False
        for url in self.engine_urls():
            try:
                if self.client.get(url + "/livez", timeout=5).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    def heal(self) -> None:
        raise NotImplementedError

    def check(self, case: doors.Case, timeout: float = doors.CLIENT_TIMEOUT) -> doors.Outcome:
        """Send ``case``; then the invariant: settled engines and coordinator, a normal request served."""
        self.heal()
        out = doors.exchange(self.client, self.url, case, timeout)
        out.problems += doors.settle(self.client, self.engine_urls(), self.admin_url, self.exited)
        if not any(isinstance(p, doors.EngineDown) for p in out.problems):
            out.problems += doors.follow_up(self.client, self.url)
        return out

    def logs(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        self.client.close()


def _limit(pid: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


class EngineDoor(Door):
    name = "engine"

    def __init__(self, mktemp: MkTemp) -> None:
        super().__init__(mktemp)
        self.engine: Engine | None = None
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.engine = e = Engine(self._mktemp("engine"), name="prop-engine", wrap=address_space_limit(AS_LIMIT),
                                 defaults={"model": doors.MODEL, "temperature": 0, **ENGINE_DEFAULTS})
        e.wait_ready(120)
        self.url = e.url

    def engine_urls(self) -> list[str]:
        assert self.engine is not None
        return [self.engine.url]

    def exited(self) -> list[str]:
        assert self.engine is not None
        rc = self.engine.proc.poll()
        return [] if rc is None else [f"the engine exited with {rc}"]

    def heal(self) -> None:
        if not self.healthy():
            assert self.engine is not None
            self.engine.stop(10)
            self.restarts += 1
            self._start()

    def logs(self) -> str:
        return self.engine.log() if self.engine is not None else ""

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        super().stop()


class FrontDoor(Door):
    name = "front"

    def __init__(self, mktemp: MkTemp) -> None:
        super().__init__(mktemp)
        # Short coordinator timeouts: a silent engine becomes a 503/504 well within the client's 30 s.
        # No load on demand: a request naming the pool's other model must not swap the only engine.
        self.engine: Engine | None = None
        self.coordinator = Coordinator(mktemp("pool"), profiles=PROFILES, heartbeat_interval_s=INTERVAL,
                                       extra={"first_token_timeout_s": 20, "token_timeout_s": 10,
                                              "load_on_demand": False})
        try:
            _limit(self.coordinator.proc.pid)
            self.coordinator.wait_ready()
            self.url = self.admin_url = self.coordinator.url
            self._start_engine()
        except BaseException:
            self.stop()
            raise

    def _start_engine(self) -> None:
        self.engine = e = Engine(self._mktemp("pool-engine"), name=POOL_ENGINE, wrap=address_space_limit(AS_LIMIT),
                                 defaults=ENGINE_DEFAULTS,
                                 extra={"bus": self.coordinator.engine_bus(heartbeat_interval_s=INTERVAL)})
        # this very process, not a record of one that died and has not been missed yet
        self.coordinator.wait_engines(
            lambda es: POOL_ENGINE in es and es[POOL_ENGINE]["pid"] == e.proc.pid and es[POOL_ENGINE]["alive"]
            and es[POOL_ENGINE]["stage"] == "ready" and es[POOL_ENGINE]["model"] == doors.MODEL,
            timeout=120, what=f"{POOL_ENGINE} serving {doors.MODEL}")

    def engine_urls(self) -> list[str]:
        assert self.engine is not None
        return [self.engine.url]

    def exited(self) -> list[str]:
        out = []
        if (rc := self.coordinator.proc.poll()) is not None:
            out.append(f"the coordinator exited with {rc}")
        if self.engine is not None and (rc := self.engine.proc.poll()) is not None:
            out.append(f"the pool's engine exited with {rc}")
        return out

    def heal(self) -> None:
        if self.healthy():
            return
        self.restarts += 1
        if self.coordinator.proc.poll() is not None:
            self.coordinator.start_again()
            _limit(self.coordinator.proc.pid)
            self.coordinator.wait_ready()
        if self.engine is not None:
            self.engine.stop(10)
        self._start_engine()

    def logs(self) -> str:
        return (self.coordinator.log()[-20000:] + "\n----- engine -----\n"
                + (self.engine.log()[-20000:] if self.engine is not None else ""))

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.coordinator.stop()
        super().stop()

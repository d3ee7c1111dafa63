"""The engine daemon's composition root (its command line is ``hydrad.cli.hydrad``).

Wires settings, the engine core, the HTTP plane and systemd. Signal handlers only set
flags or enqueue; the serve loop acts on them. READY=1 goes out as soon as the HTTP port
listens, before any model: a model-less engine is ready to be configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from hydrad import __version__
from hydrad.common import fdlimit
from hydrad.common.cpus import CpuLimits, usable_cpus
from hydrad.engine import ggml, jinjabox, llama
from hydrad.engine.control import EngineControl
from hydrad.engine.fetch import ModelFetcher
from hydrad.engine.sleep import IdleSleep
from hydrad.engine.core import EngineCore
from hydrad.engine.pulse import LoopTicker, Pulse
from hydrad.engine.snapshot import EngineSnapshot, status_text
from hydrad.common.logs import log_event
from hydrad.common.loopwatch import LoopWatch
from hydrad.common.params import ParamError
from hydrad.common.registry import Registry, UnknownModel
from hydrad.common.sdnotify import Notifier
from hydrad.common.apikey import api_keys, with_api_key
from hydrad.common.browser import BrowserGuard
from hydrad.common.cors import with_cors
from hydrad.common.serving import uvicorn_server
from hydrad.engine.settings import LoadedConfig, load_config
from hydrad.wire.stages import LOADING_STAGES

log = logging.getLogger("hydrad")


class Daemon:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.settings = loaded.settings
        self.notifier = Notifier.from_env()
        self.stop_requested = asyncio.Event()
        self.hup_requested = asyncio.Event()
        self._reloading = False  # between RELOADING=1 and READY=1: systemd's reload job waits on us
        self.core = EngineCore(on_status=self._on_status, max_queue=self.settings.max_queue,
                               drain_timeout_s=self.settings.drain_timeout_s, device=self.settings.device,
                               prefix=self.settings.prefix, slow_turn_ms=self.settings.logging.slow_turn_ms,
                               reaper=self.settings.reaper, load_threads=self.settings.load_threads)
        self.control: EngineControl | None = None
        self.ggml_server: ggml.RpcServerThread | None = None
        self.merged: Any = None

    def _on_status(self, snap: EngineSnapshot) -> None:
        """``STATUS=`` on every stage change; ``EXTEND_TIMEOUT_USEC`` only while a systemd job waits
        for us (a SIGHUP reload). READY=1 comes before any load, so a load is runtime work and must
        not extend anything: systemd 252 also moves the watchdog deadline on EXTEND_TIMEOUT_USEC, and
        extending on every load made a hang right after one go unnoticed for 30 s whatever
        WatchdogSec said."""
        self.notifier.status(status_text(snap))
        if self._reloading and snap.stage in LOADING_STAGES:
            self.notifier.extend_timeout(30.0)

    async def run(self) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        llama.set_llama_log_level(s.logging.llama_level)
        fd_limit = fdlimit.raise_soft_limit(log)
        jinjabox.configure(s.templates)
        try:
            registry = Registry.load(s.registry, s.models_dir, s.models)
        except ValueError as exc:
            log_event(log, logging.ERROR, "bad model registry", error=str(exc))
            return 2
        fetcher = ModelFetcher(s.fetch, s.models_dir, s.bus.token_path) if s.fetch.enabled else None
        self.control = EngineControl(self.core, registry, s.defaults, fetcher)
        from hydrad.engine.http.app import build_app

        app = with_api_key(build_app(s, self.control), api_keys(s.http, self.loaded.api_keys))
        guarded = BrowserGuard(with_cors(app, s.http.cors_origins), listen_host=s.http.host,
                               allowed_hosts=s.http.allowed_hosts, cors_origins=s.http.cors_origins)
        server = uvicorn_server(guarded, s.http.host, s.http.port, s.http.header_timeout_s,
                                logging.getLogger("hydrad.http"))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        loop.add_signal_handler(signal.SIGHUP, self.hup_requested.set)
        self.core.start(loop)
        if s.rpc.enabled:
            try:
                rpc_port = self._start_rpc(loop)
            except OSError as exc:
                log_event(log, logging.ERROR, "cannot open the merged RPC port", host=s.rpc.host, port=s.rpc.port,
                          error=str(exc))
                self.core.stop()
                return 1
            log_event(log, logging.INFO, "merged RPC port", rpc=f"{s.rpc.host}:{rpc_port}",
                      ggml_rpc=self.ggml_server.endpoint if self.ggml_server else "off")
        serve = asyncio.create_task(server.serve(), name="http")
        while not server.started:
            if serve.done():
                log_event(log, logging.ERROR, "HTTP server failed to start", host=s.http.host, port=s.http.port)
                self.core.stop()
                return 1
            await asyncio.sleep(0.005)
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else s.http.port
        cpus = CpuLimits()  # what "every core" is here: the thread pools' default, and the limits it came from
        log_event(log, logging.INFO, "listening", engine=s.name, http=f"{s.http.host}:{port}", version=__version__,
                  cpus=cpus.usable, affinity_cpus=cpus.affinity,
                  cpu_quota="none" if cpus.quota is None else round(cpus.quota, 2), fd_limit=fd_limit)
        self.notifier.ready()
        self.notifier.status(status_text(self.core.snapshot(), with_progress=False))
        watch = LoopWatch(loop, s.logging.slow_loop_ms / 1000, log) if s.logging.slow_loop_ms else None
        if watch is not None:
            watch.start()
        # the watchdog ping and the bus link live on the pulse's own loop (hydrad.engine.pulse says why)
        ticker = LoopTicker()
        ticker.start()
        pulse = Pulse()
        pulse.start()
        pulse.spawn(self._watchdog(ticker))
        tasks = [asyncio.create_task(self._hup_loop(), name="sighup"),
                 asyncio.create_task(IdleSleep(self.control).run(), name="idle-sleep")]
        link = None
        if s.bus.endpoint:  # the coordinator's bus; without an endpoint the engine stands alone
            from hydrad.engine.bus.link import EngineLink

            link = EngineLink(s, self.control, http=f"{s.http.host}:{port}",
                              rpc=f"{s.rpc.host}:{rpc_port}" if s.rpc.enabled else None, pulse=pulse, ticker=ticker)
            link.start()
        try:
            await self.control.boot()
        except (UnknownModel, ParamError) as exc:
            log_event(log, logging.ERROR, "configured model cannot be loaded; staying model-less", error=str(exc))
            self.core.record_error(str(exc))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait([stop, serve], return_when=asyncio.FIRST_COMPLETED)
        await self._drain()
        if link is not None:
            await link.close()
        server.should_exit = True
        if self.merged is not None:
            self.merged.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serve, timeout=10)
        for t in tasks:
            t.cancel()
        ticker.stop()
        await asyncio.to_thread(pulse.stop)
        await asyncio.to_thread(self.core.join, 10)
        if watch is not None:
            watch.stop()
        log_event(log, logging.INFO, "stopped", engine=s.name)
        return 0

    def _start_rpc(self, loop: asyncio.AbstractEventLoop) -> int:
        from hydrad.engine.rpc.server import MergedPort

        s = self.settings
        endpoint = None
        if s.rpc.ggml_rpc:
            cache = s.rpc.cache_dir or Path(os.environ.get("CACHE_DIRECTORY") or Path.home() / ".cache" / "hydra") / f"rpc-{s.name}"
            # on an internal loopback port, reserved before anything else of this engine binds one
            self.ggml_server = ggml.RpcServerThread("127.0.0.1", 0, cache, s.rpc.ggml_threads or usable_cpus())
            self.ggml_server.start()
            endpoint = ("127.0.0.1", self.ggml_server.port)
        gs = self.ggml_server
        self.merged = MergedPort(s, self.control, loop, endpoint,
                                 devices=lambda: [d.public() for d in gs.devices] if gs else [])  # type: ignore[union-attr]
        assert self.control is not None
        return self.merged.start()

    async def _drain(self) -> None:
        """Stop admitting, let in-flight requests finish within the bound, then end the engine."""
        self.notifier.stopping()
        self.notifier.extend_timeout(self.settings.drain_timeout_s + 10)  # a drain bound beyond TimeoutStopSec
        self.core.stop_admitting()
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while time.monotonic() < deadline:
            v = self.core.slots_view()
            if v["busy"] == 0 and v["queued"] == 0:
                break
            await asyncio.sleep(0.05)
        else:
            log_event(log, logging.WARNING, "drain timed out; ending remaining requests",
                      timeout_s=self.settings.drain_timeout_s)
        self.core.stop()
        await asyncio.sleep(0.05)  # let the final events reach their streams

    async def _watchdog(self, ticker: LoopTicker) -> None:
        """On the pulse loop: ping while the engine thread steps and the main loop is not hung for good
        (a main loop busy for seconds is no reason for systemd to kill every stream)."""
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        limit = interval * 2
        while True:
            if not (self.core.alive and time.monotonic() - self.core.heartbeat < limit):
                log_event(log, logging.ERROR, "engine thread stalled or dead; withholding WATCHDOG=1")
            elif ticker.hung():
                log_event(log, logging.ERROR, "event loop hung; withholding WATCHDOG=1",
                          stalled_s=round(ticker.stalled_for(), 1))
            else:
                self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def _hup_loop(self) -> None:
        """SIGHUP: re-read the YAML (over the same command line) and apply the change of its
        ``defaults:`` like a configure."""
        while True:
            await self.hup_requested.wait()
            self.hup_requested.clear()
            self.notifier.reloading()
            self._reloading = True
            try:
                fresh = load_config(self.loaded.path, self.loaded.flags, self.loaded.api_keys)
                changed_t4 = [k for k in ("name", "http", "rpc", "bus", "models_dir", "control_allow_from", "logging",
                                          "device")
                              if getattr(fresh.settings, k) != getattr(self.settings, k)]
                if changed_t4:
                    log_event(log, logging.WARNING, "start-only settings changed; restart to apply",
                              fields=",".join(changed_t4))
                assert self.control is not None
                result = await self.control.apply_yaml(fresh.settings.defaults)
                log_event(log, logging.INFO, "config re-read", **result.public())
                if result.load_id is not None:
                    await self.core.loads[result.load_id].wait()  # done, failed, or aborted by a newer configure
            except Exception as exc:
                log_event(log, logging.ERROR, "config re-read failed; keeping the running config", error=str(exc))
            self._reloading = False
            self.notifier.ready()
            self.notifier.status(status_text(self.core.snapshot(), with_progress=False))

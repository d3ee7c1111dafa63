"""``hydra-coordinator``: the coordinator's composition root.

Wires settings, the model registry, profiles, the bus (ROUTER + PUB), the profile switcher,
the OpenAI front door and the admin API, and talks to systemd like ``hydrad`` does:
READY=1 once the bus is bound and HTTP listens (engines may come later: a coordinator with
no engine yet is up and says so in STATUS=), STATUS= whenever the pool changes, WATCHDOG=1
only while the bus tasks run, STOPPING=1 on SIGTERM. Signal handlers only set a flag.

Secrets are read once at start, from files (never from the YAML): the bus token (engines must
present it to register), the admin token (``/admin/*`` needs it as a bearer token) and the
events token (a console must present it to subscribe; ``eventsdoor``). A bus that listens beyond
loopback without a token is refused at start: anyone who can reach it could register as an
engine and receive users' prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path

import zmq
from starlette.applications import Starlette

from hydrad import __version__
from hydrad.common import fdlimit, tokenfile, webui
from hydrad.coordinator.admin import ADMIN_BODIES, admin_routes
from hydrad.coordinator.affinity import Affinity
from hydrad.coordinator.bus import CoordinatorBus
from hydrad.coordinator.eventsdoor import EventsDoor, events_token
from hydrad.coordinator.frontdoor import FrontDoor, exception_handlers
from hydrad.coordinator.guard import Guard
from hydrad.coordinator.modelfiles import ModelFiles, model_file_routes
from hydrad.coordinator.profiles import ProfileSet, load_profiles
from hydrad.coordinator.sessions import SessionKeeper
from hydrad.coordinator.settings import ConfigError, CoordinatorSettings, LoadedConfig, bus_is_loopback, load_config
from hydrad.coordinator.state import StateFile, choose_start_profile
from hydrad.coordinator.switcher import ProfileSwitcher
from hydrad.common.logs import log_event, setup_logging
from hydrad.common.registry import Registry
from hydrad.common.sdnotify import Notifier
from hydrad.common.apikey import api_keys, with_api_key
from hydrad.common.browser import BrowserGuard
from hydrad.common.cors import with_cors
from hydrad.common.openapi import openapi_route
from hydrad.common.serving import run_loop, uvicorn_server
from hydrad.wire.bodies import FRONT_DOOR_BODIES
from hydrad.store import StoreError

log = logging.getLogger("hydra.coordinator")


def _load_parts(s: CoordinatorSettings) -> tuple[Registry, ProfileSet]:
    """Registry and profiles, checked against each other; ValueError naming the file otherwise."""
    registry = Registry.load(s.registry, Path("."))
    profiles = load_profiles(s.profiles) if s.profiles is not None else ProfileSet()
    if s.default_profile is not None:
        try:
            profiles.get(s.default_profile)
        except KeyError as exc:
            raise ValueError(f"default_profile: {exc.args[0]}") from None
    return registry, profiles


class CoordinatorDaemon:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.settings = loaded.settings
        self.notifier = Notifier.from_env()
        self.stop_requested = asyncio.Event()

    async def run(self) -> int:
        s = self.settings
        loop = asyncio.get_running_loop()
        fd_limit = fdlimit.raise_soft_limit(log)
        try:
            registry, profiles = _load_parts(s)
        except ValueError as exc:
            log_event(log, logging.ERROR, "bad registry or profiles", error=str(exc))
            return 2
        bus = CoordinatorBus(s, version=__version__)
        try:
            bus.load_token()
            admin_token = tokenfile.read_token(s.admin_token_file) if s.admin_token_file is not None else None
            token, events_source = events_token(s, StateFile.for_settings(s).path.parent)
            bus.events_door = EventsDoor(token)
        except tokenfile.TokenError as exc:
            log_event(log, logging.ERROR, "cannot read a token file", error=str(exc))
            return 2
        if bus.token is None:
            if not bus_is_loopback(s.bus.endpoint):
                log_event(log, logging.ERROR, "the bus listens beyond loopback but has no token: any host that "
                          "reaches it could register as an engine; set bus_token_file", bus=s.bus.endpoint,
                          how=tokenfile.HOW_TO_CREATE)
                return 2
            log_event(log, logging.WARNING, "the bus has no token: any local process can register as an engine; "
                      "set bus_token_file", bus=s.bus.endpoint)
        if not bus_is_loopback(s.events) and not s.bus.curve_secret_key:
            log_event(log, logging.WARNING, "the events socket listens beyond loopback without CURVE keys: its "
                      "subscribers' token crosses the network in the clear; set bus.curve_secret_key", events=s.events)
        try:
            bus.start()
        except zmq.ZMQError as exc:
            log_event(log, logging.ERROR, "cannot bind the bus", bus=s.bus.endpoint, events=s.events, error=str(exc))
            return 1
        affinity = Affinity()
        state = StateFile.for_settings(s)
        start = choose_start_profile(s, profiles, state)
        log_event(log, logging.WARNING if start.warn else logging.INFO,
                  "saved state unusable; start profile from the default" if start.warn else "start profile",
                  profile=start.name or "-", source=start.source, why=start.reason)
        switcher = ProfileSwitcher(s, bus, registry, profiles, active=start.name, state=state)
        keeper = None
        if s.sessions.keep:
            try:
                keeper = SessionKeeper(s.sessions, bus.engines, bus.publish, places=affinity)
            except (StoreError, tokenfile.TokenError, OSError) as exc:
                log_event(log, logging.ERROR, "cannot open the session store", dir=str(s.sessions.store.location()),
                          error=str(exc), how="set sessions.store.dir to a writable directory, or sessions.keep: false")
                await bus.close()
                return 2
        front = FrontDoor(s, bus, switcher, registry, affinity, keeper)
        files = ModelFiles(registry, s.models_dir, [t for t in (bus.token, admin_token) if t] if bus.token else [],
                           s.model_files_rate_mib_s)
        front.pool.served_files = files.available  # on-demand loads may send an engine to fetch one of these
        routes = front.routes() + admin_routes(bus, switcher, affinity, front) + model_file_routes(files) \
            + webui.routes(s.http.webui)
        described = openapi_route(routes, "hydra-coordinator", __version__, bodies={**FRONT_DOOR_BODIES, **ADMIN_BODIES})
        app = Starlette(routes=[*routes, described], exception_handlers=exception_handlers())
        keyed = with_api_key(app, api_keys(s.http))
        guarded = Guard(with_cors(keyed, s.http.cors_origins), admin_allow_from=s.admin_allow_from, admin_token=admin_token,
                        max_body_bytes=s.max_body_bytes, body_timeout_s=s.body_timeout_s)
        server = uvicorn_server(BrowserGuard(guarded, listen_host=s.http.host, allowed_hosts=s.http.allowed_hosts,
                                             cors_origins=s.http.cors_origins), s.http.host, s.http.port,
                                s.http.header_timeout_s, log)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        serve = asyncio.create_task(server.serve(), name="http")
        while not server.started:
            if serve.done():
                log_event(log, logging.ERROR, "HTTP server failed to start", host=s.http.host, port=s.http.port)
                await bus.close()
                return 1
            await asyncio.sleep(0.005)
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else s.http.port
        if s.models_dir is not None and bus.token is not None:
            bus.offer_files(port)
        elif s.models_dir is not None:
            log_event(log, logging.WARNING, "models_dir is set but the bus has no token: model files are served to "
                      "nobody; set bus_token_file", models_dir=str(s.models_dir))
        log_event(log, logging.INFO, "listening", http=f"{s.http.host}:{port}", bus=bus.bus_endpoint,
                  events=bus.events_endpoint, profile=switcher.active or "-", version=__version__,
                  bus_token=bus.token is not None, admin_token=admin_token is not None, events_token=events_source,
                  admin_allow_from=",".join(s.admin_allow_from), fd_limit=fd_limit,
                  model_files=str(s.models_dir) if bus.files_port is not None else "-")
        self.notifier.ready()
        tasks = [asyncio.create_task(self._watchdog(bus), name="watchdog"),
                 asyncio.create_task(self._status(bus, front, switcher), name="status")]
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait([stop, serve], return_when=asyncio.FIRST_COMPLETED)
        self.notifier.stopping()
        front.admitting = False
        deadline = time.monotonic() + s.drain_timeout_s
        while bus.inflight_total() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serve, timeout=10)
        for t in tasks:
            t.cancel()
        await front.native.close()
        if keeper is not None:
            keeper.close()
        await bus.close()
        log_event(log, logging.INFO, "stopped")
        return 0

    async def _watchdog(self, bus: CoordinatorBus) -> None:
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        while True:
            if bus.healthy:
                self.notifier.watchdog()
            else:
                log_event(log, logging.ERROR, "bus tasks ended; withholding WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _status(self, bus: CoordinatorBus, front: FrontDoor, switcher: ProfileSwitcher) -> None:
        """STATUS= for systemctl status, sent when it changes (checked twice a second)."""
        last = ""
        while True:
            engines = list(bus.engines.values())
            served = front.served()
            text = (f"engines {sum(1 for e in engines if e.alive)}/{len(engines)} alive; "
                    f"profile {switcher.active or '-'}{' (switching)' if switcher.switching else ''}; "
                    f"serving {','.join(sorted(served)) or 'nothing'}")
            if text != last:
                self.notifier.status(text)
                last = text
            await asyncio.sleep(0.5)


def build_parser() -> argparse.ArgumentParser:
    """hydra-coordinator's command line (also read by scripts/gen_docs for docs/reference/cli.md)."""
    ap = argparse.ArgumentParser(prog="hydra-coordinator", description="Hydra coordinator: bus, routing, profiles, OpenAI front door.")
    ap.add_argument("--config", help="coordinator YAML (e.g. /etc/hydra/coordinator.yaml)")
    ap.add_argument("--check-config", metavar="FILE", help="validate FILE (and its registry and profiles) and exit")
    ap.add_argument("--version", action="version", version=f"hydra-coordinator {__version__}")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    path = args.check_config or args.config
    try:
        loaded = load_config(path)
        _load_parts(loaded.settings)
    except (ConfigError, ValueError) as exc:
        print(f"hydra-coordinator: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"{args.check_config}: ok")
        return 0
    setup_logging(loaded.settings.logging.level)
    return run_loop(CoordinatorDaemon(loaded).run())


if __name__ == "__main__":
    sys.exit(main())

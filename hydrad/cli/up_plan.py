"""``hydractl up``'s planning: read the pool's configs, move ports by ``--port-offset``, write the
copies a run needs, and check every port before anything starts (``Plan``, :func:`plan`,
:func:`check_ports`). Nothing here starts a process; ``up.py`` supervises them."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hydrad.common import tokenfile
from hydrad.cli.common import CliError
from hydrad.common.netaccess import split_socket_endpoint

EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_INTERRUPTED = 130

DEFAULT_CONFIG_DIR = Path("etc") / "hydra" / "dev"
COORDINATOR_FILE = "coordinator.yaml"
POLL_S = 0.25
TAIL_LINES = 30
# hydra-console's defaults (tui/app.py: DEFAULT_ADMIN, DEFAULT_EVENTS; the command line may not import
# the console, so a unit test holds the two equal): a pool elsewhere needs --admin and --coordinator.
CONSOLE_ADMIN = "http://127.0.0.1:9000"
CONSOLE_EVENTS = "tcp://127.0.0.1:9501"
# What systemd hands a service; meaningless (or harmful) for processes we start ourselves.
SERVICE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID",
               "LISTEN_FDNAMES", "INVOCATION_ID", "STATE_DIRECTORY")



# ----- configs ---------------------------------------------------------------------------

@dataclass
class Port:
    host: str
    port: int
    what: str  # "coordinator HTTP", "dev-a RPC", ...
    where: str  # "etc/hydra/dev/dev-a.yaml: rpc.port"


@dataclass
class Plan:
    """What to start: effective config files, the ports they take, the URLs to talk to."""

    config_dir: Path
    coordinator_config: Path
    engine_configs: dict[str, Path]  # engine name → config file to run it with
    profile: str
    targets: dict[str, str | None]  # engine → model the profile gives it (None: PEER)
    http_url: str  # coordinator's front door as a client reaches it
    engine_urls: dict[str, str]
    ports: list[Port]
    copies: bool  # configs were rewritten into a directory of ours
    profiles: list[str]  # every profile of the profiles file
    admin_token_file: Path | None = None  # the coordinator's, if it has one: start-up polls /admin with it
    events_url: str = CONSOLE_EVENTS  # the coordinator's event stream (PUB) as a client reaches it
    curve_server_key: str | None = None  # the coordinator's CURVE public key, when its bus and events are encrypted


def default_config_dir() -> Path:
    """``etc/hydra/dev`` of the current directory, else of the checkout this package runs from."""
    if (DEFAULT_CONFIG_DIR / COORDINATOR_FILE).is_file():
        return DEFAULT_CONFIG_DIR
    return Path(__file__).resolve().parents[2] / DEFAULT_CONFIG_DIR


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_BAD_CONFIG) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML: {exc}", EXIT_BAD_CONFIG) from None
    if not isinstance(raw, dict):
        raise CliError(f"{path}: top level must be a mapping of settings", EXIT_BAD_CONFIG)
    return raw


def _moved(endpoint: str, offset: int) -> str:
    host, port = split_socket_endpoint(endpoint)
    scheme = endpoint.split("://", 1)[0] if "://" in endpoint else "tcp"
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port + offset if port else 0}"


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "*", "", "::") else host


def _url(host: str, port: int, scheme: str = "http") -> str:
    host = _client_host(host)
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def plan(config_dir: Path, profile: str | None, offset: int, copy_dir: Path, state_dir: Path | None = None) -> Plan:
    """Read and check the configs; write moved copies into ``copy_dir`` when they must differ.

    ``state_dir`` is where the coordinator keeps what it would resume after a restart (the
    active profile); a pool of ``hydractl up`` is new every time, so it gets a directory of its
    own run, and a config that names one is copied to point elsewhere.
    """
    from hydrad.coordinator.settings import CoordinatorSettings
    from hydrad.coordinator.profiles import load_profiles
    from hydrad.coordinator.settings import ConfigError as CoordConfigError
    from hydrad.coordinator.settings import load_config as load_coordinator
    from hydrad.common.registry import Registry
    from hydrad.engine.settings import ConfigError as EngineConfigError
    from hydrad.engine.settings import load_config as load_engine

    coord_path = config_dir / COORDINATOR_FILE
    if not coord_path.is_file():
        raise CliError(f"no {coord_path}: --config-dir must hold {COORDINATOR_FILE} and one <engine>.yaml per engine",
                       EXIT_BAD_CONFIG)
    try:
        cs = load_coordinator(coord_path).settings
        Registry.load(cs.registry, Path("."))
        profiles = load_profiles(cs.profiles) if cs.profiles is not None else None
    except (CoordConfigError, ValueError) as exc:
        raise CliError(str(exc), EXIT_BAD_CONFIG) from None
    if profiles is None or not profiles.profiles:
        raise CliError(f"{coord_path}: no profiles file, so no engine to start", EXIT_BAD_CONFIG)
    name = profile or cs.default_profile or profiles.default_name
    try:
        active = profiles.get(name)  # type: ignore[arg-type]
    except KeyError as exc:
        raise CliError(str(exc.args[0]), EXIT_BAD_CONFIG) from None
    engines: list[str] = []  # every engine any profile names, so later switches find them all
    for p in profiles.profiles.values():
        engines += [e for e in p.engines if e not in engines]
    targets = {e: (active.engines[e].model if e in active.engines else None) for e in engines}

    has_state = "state_dir" in CoordinatorSettings.model_fields
    own_state = has_state and getattr(cs, "state_dir", None) is not None
    copies = offset != 0 or name != (cs.default_profile or profiles.default_name) or (own_state and state_dir is not None)
    ports: list[Port] = []
    bus_host, bus_port = split_socket_endpoint(cs.bus.endpoint)
    ev_host, ev_port = split_socket_endpoint(cs.events)
    shown = display_path(coord_path)
    ports += [Port(cs.http.host, cs.http.port + offset, "coordinator HTTP", f"{shown}: http.port"),
              Port(bus_host, bus_port + offset, "coordinator bus", f"{shown}: bus"),
              Port(ev_host, ev_port + offset, "coordinator events", f"{shown}: events")]
    # An explicit request stream is a port of the pool like the others. The default (auto) follows the bus
    # by itself, and a taken port there only keeps requests on the bus, so it is not checked.
    stream = cs.bus.stream_plan()
    explicit_stream = stream[0] if stream is not None and stream[1] else None
    if explicit_stream is not None:
        st_host, st_port = split_socket_endpoint(explicit_stream)
        ports.append(Port(st_host, st_port + offset, "coordinator request stream", f"{shown}: bus.request_stream"))
    if copies:
        raw = _read_yaml(coord_path)
        raw.setdefault("http", {})["port"] = cs.http.port + offset
        if isinstance(raw.get("bus"), dict):
            raw["bus"]["endpoint"] = _moved(cs.bus.endpoint, offset)
            if explicit_stream is not None:
                raw["bus"]["request_stream"] = _moved(explicit_stream, offset).split("://", 1)[1]
        else:
            raw["bus"] = _moved(cs.bus.endpoint, offset)
        raw["events"] = _moved(cs.events, offset)
        raw["registry"] = str(cs.registry)
        raw["profiles"] = str(cs.profiles)
        raw["default_profile"] = name
        if has_state and state_dir is not None:
            raw["state_dir"] = str(state_dir)
        coord_run = copy_dir / COORDINATOR_FILE
        coord_run.write_text(yaml.safe_dump(raw, sort_keys=False))
    else:
        coord_run = coord_path

    engine_configs: dict[str, Path] = {}
    engine_urls: dict[str, str] = {}
    for engine in engines:
        path = config_dir / f"{engine}.yaml"
        if not path.is_file():
            raise CliError(f"the profiles name engine {engine}, but there is no {path}", EXIT_BAD_CONFIG)
        try:
            es = load_engine(path).settings
        except EngineConfigError as exc:
            raise CliError(str(exc), EXIT_BAD_CONFIG) from None
        shown = display_path(path)
        if es.name != engine:
            raise CliError(f"{shown}: name is {es.name!r}; the profiles call this engine {engine!r}", EXIT_BAD_CONFIG)
        if not es.bus.endpoint:
            raise CliError(f"{shown}: no bus.endpoint, so the coordinator would never hear of {engine}; "
                           f"set it to {cs.bus.endpoint}", EXIT_BAD_CONFIG)
        try:
            _, port = split_socket_endpoint(es.bus.endpoint)
        except ValueError as exc:
            raise CliError(f"{shown}: bus.endpoint: {exc}", EXIT_BAD_CONFIG) from None
        if port != bus_port:
            raise CliError(f"{shown}: bus.endpoint {es.bus.endpoint} is not the coordinator's bus "
                           f"({cs.bus.endpoint} in {display_path(coord_path)})", EXIT_BAD_CONFIG)
        ports.append(Port(es.http.host, es.http.port + offset if es.http.port else 0, f"{engine} HTTP",
                          f"{shown}: http.port"))
        if es.rpc.enabled:
            ports.append(Port(es.rpc.host, es.rpc.port + offset if es.rpc.port else 0, f"{engine} RPC",
                              f"{shown}: rpc.port"))
        engine_urls[engine] = _url(es.http.host, es.http.port + offset)
        if copies:
            raw = _read_yaml(path)
            raw.setdefault("http", {})["port"] = es.http.port + offset if es.http.port else 0
            raw.setdefault("rpc", {})["port"] = es.rpc.port + offset if es.rpc.port else 0
            raw.setdefault("bus", {})["endpoint"] = _moved(es.bus.endpoint, offset)
            raw["models_dir"] = str(es.models_dir)
            if es.registry is not None:
                raw["registry"] = str(es.registry)
            if es.rpc.cache_dir is not None and not es.rpc.cache_dir.is_absolute():
                raw["rpc"]["cache_dir"] = str((path.resolve().parent / es.rpc.cache_dir).resolve())
            run_path = copy_dir / f"{engine}.yaml"
            run_path.write_text(yaml.safe_dump(raw, sort_keys=False))
            try:
                load_engine(run_path)
            except EngineConfigError as exc:
                raise CliError(f"{exc} (moved by --port-offset {offset})", EXIT_BAD_CONFIG) from None
            engine_configs[engine] = run_path
        else:
            engine_configs[engine] = path
    if copies:
        try:
            load_coordinator(coord_run)
        except CoordConfigError as exc:
            raise CliError(f"{exc} (moved by --port-offset {offset})", EXIT_BAD_CONFIG) from None
    return Plan(config_dir=config_dir, coordinator_config=coord_run, engine_configs=engine_configs, profile=name,  # type: ignore[arg-type]  # get() refused None
                targets=targets, http_url=_url(cs.http.host, cs.http.port + offset), engine_urls=engine_urls,
                ports=ports, copies=copies, profiles=list(profiles.profiles), admin_token_file=cs.admin_token_file,
                events_url=_url(ev_host, ev_port + offset, "tcp") if cs.events.startswith("tcp://") else cs.events,
                curve_server_key=cs.bus.curve_public_key)


def display_path(path: Path) -> str:
    """A path as the operator typed it, relative to the current directory when it is below it."""
    with contextlib.suppress(ValueError):
        return os.path.relpath(os.path.abspath(path)) if Path(os.path.abspath(path)).is_relative_to(Path.cwd()) \
            else str(path)
    return str(path)


def hydractl_command() -> str:
    """How to run hydractl from here: its name when it is on PATH, else the path it was run by."""
    return _command("hydractl", "hydrad.cli.hydractl")


def _command(name: str, module: str) -> str:
    """How to run one of this package's commands from here: its name when it is on PATH, else the
    script beside the hydractl that runs (scripts/run: .venv/bin/), else ``python -m``."""
    if shutil.which(name):
        return name
    argv0 = Path(sys.argv[0])
    if argv0.name == "hydractl" and (argv0.parent / name).is_file():
        return display_path(argv0.parent / name)
    return f"{display_path(Path(sys.executable))} -m {module}"


def console_command(p: Plan, events_token_file: Path | None = None) -> str:
    """The exact ``hydra-console`` command line for this pool: ``--admin`` and ``--coordinator`` when
    either differs from the console's defaults (a --port-offset, another config), its CURVE key when
    the events are encrypted, the admin token file when the coordinator wants one, and the events
    token file the pool's events socket asks of subscribers."""
    words = [_command("hydra-console", "tui.app")]
    if p.http_url != CONSOLE_ADMIN or p.events_url != CONSOLE_EVENTS:
        words += ["--admin", shlex.quote(p.http_url), "--coordinator", shlex.quote(p.events_url)]
    if p.curve_server_key:
        words += ["--curve-server-key", shlex.quote(p.curve_server_key)]
    if p.admin_token_file is not None:
        words.insert(0, "HYDRA_ADMIN_TOKEN_FILE=" + shlex.quote(display_path(p.admin_token_file)))
    if events_token_file is not None:
        words.insert(0, f"{tokenfile.ENV_EVENTS_TOKEN_FILE}=" + shlex.quote(display_path(events_token_file)))
    return " ".join(words)


def check_ports(ports: list[Port]) -> None:
    """Every port is free and asked for once; a CliError naming the port and who wants it otherwise."""
    seen: dict[int, Port] = {}
    for p in ports:
        if p.port == 0:
            continue
        if not 0 < p.port < 65536:
            raise CliError(f"port {p.port} ({p.what}, {p.where}) is out of range; a smaller --port-offset?",
                           EXIT_BAD_CONFIG)
        if p.port in seen:
            other = seen[p.port]
            raise CliError(f"port {p.port} is asked for twice: {other.what} ({other.where}) and {p.what} ({p.where})",
                           EXIT_BAD_CONFIG)
        seen[p.port] = p
        host = "0.0.0.0" if p.host in ("*", "") else p.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no conflict
            try:
                s.bind((host, p.port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise CliError(f"port {p.port} is already in use: it is the {p.what} port ({p.where}); stop what "
                                   f"listens there, or run with --port-offset N", EXIT_START_FAILED) from None
                raise CliError(f"cannot bind {host}:{p.port} ({p.what}, {p.where}): {exc.strerror or exc}",
                               EXIT_START_FAILED) from None

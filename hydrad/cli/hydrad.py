"""``hydrad``: the engine daemon's command line (run, ``--check-config``, ``--print-config``).

It sits above both planes because ``--check-config --coordinator-config`` reads the pool's
coordinator config too; the daemon itself is ``hydrad.engine.daemon``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from hydrad import __version__
from hydrad.common.logs import setup_logging
from hydrad.common.params import RuntimeParams
from hydrad.common.registry import Registry
from hydrad.common.serving import run_loop
from hydrad.engine import llama
from hydrad.engine.daemon import Daemon
from hydrad.engine.gpu import CUDA_SWITCHES, bind_devices, set_cuda_switches
from hydrad.engine.settings import ConfigError, EngineSettings, LoadedConfig, load_config
from hydrad.store import StoreError


def _print_config(loaded: LoadedConfig) -> None:
    params = RuntimeParams(**loaded.settings.defaults)
    out = {"file": str(loaded.path) if loaded.path else None, "settings": loaded.sources(),
           "params": {k: {"value": v, "source": "yaml" if k in loaded.settings.defaults else "default",
                          "tier": f"T{int(RuntimeParams.tier_of(k))}"}
                      for k, v in params.model_dump(mode="json").items()}}
    print(yaml.safe_dump(out, sort_keys=False, default_flow_style=False), end="")


def pool_warnings(settings: EngineSettings, coordinator_config: str | None = None) -> list[str]:
    """What keeps a valid engine config from joining a pool, for ``--check-config`` (warnings: the
    file is usable, and an engine on its own is a legitimate setup).

    An engine without ``bus.endpoint`` serves its own port but never registers: the coordinator
    says "no engine has registered", routes nothing to it and cannot apply a profile to it, with
    nothing in the engine's log to say why. That is always worth a warning. Given the pool's
    coordinator config, the warning names the profiles that place this engine, and the link is
    checked against it too: a bus port other than the coordinator's, or no token file where the
    coordinator demands one (every REGISTER would be refused).
    """
    out: list[str] = []
    bus = settings.bus
    placed: list[str] = []
    coordinator = None
    if coordinator_config is not None:
        from hydrad.coordinator.daemon import _load_parts
        from hydrad.coordinator.settings import ConfigError as CoordinatorConfigError
        from hydrad.coordinator.settings import load_config as load_coordinator_config
        try:
            coordinator = load_coordinator_config(coordinator_config).settings
        except CoordinatorConfigError as exc:
            raise ValueError(str(exc)) from None
        _, profiles = _load_parts(coordinator)
        placed = sorted(n for n, p in profiles.profiles.items() if settings.name in p.engines)
    if bus.endpoint is None:
        where = (f"; profile{'s' if len(placed) > 1 else ''} {', '.join(placed)} of {coordinator_config} "
                 f"place{'' if len(placed) > 1 else 's'} engine {settings.name!r}, and will never reach it"
                 if placed else "")
        out.append("no bus endpoint: this engine will not join a pool (the coordinator never sees it, routes "
                   f"nothing to it, applies no profile to it); add 'bus: {{endpoint: tcp://HOST:9500}}'{where}")
        return out
    if coordinator is not None:
        theirs, mine = _port(coordinator.bus.endpoint), _port(bus.endpoint)
        if theirs is not None and mine is not None and theirs != mine:
            out.append(f"bus.endpoint {bus.endpoint} is not the coordinator's port {theirs} "
                       f"({coordinator.bus.endpoint})")
        if coordinator.bus_token_file is not None and bus.token_file is None \
                and not os.environ.get("HYDRA_BUS_TOKEN_FILE", "").strip():
            out.append("the coordinator requires a bus token (bus_token_file) and this engine has no "
                       "bus.token_file: every REGISTER will be refused")
    return out


def _port(endpoint: str) -> int | None:
    head, sep, tail = endpoint.rpartition(":")
    return int(tail) if sep and head.startswith("tcp://") and tail.isdigit() else None


def build_parser() -> argparse.ArgumentParser:
    """hydrad's command line (also read by scripts/gen_docs for docs/reference/cli.md)."""
    ap = argparse.ArgumentParser(prog="hydrad", description="Hydra engine daemon: one per GPU.")
    ap.add_argument("--config", help="engine YAML (e.g. /etc/hydra/5060ti.yaml)")
    ap.add_argument("--check-config", metavar="FILE", help="validate FILE and exit (non-zero naming the bad field)")
    ap.add_argument("--coordinator-config", metavar="FILE",
                    help="with --check-config: the pool's coordinator config, to check that this engine can join it")
    ap.add_argument("--print-config", metavar="FILE", help="show effective values and where each came from")
    ap.add_argument("--json", action="store_true", help="with --print-config: JSON instead of YAML")
    ap.add_argument("--version", action="version", version=f"hydrad {__version__}")
    return ap


def main(argv: list[str] | None = None) -> int:
    llama.preload_native()  # before numpy & co. link the C++ runtime: see preload_native
    ap = build_parser()
    args = ap.parse_args(argv)
    path = args.check_config or args.print_config or args.config
    try:
        loaded = load_config(path)
        if args.check_config or args.print_config:
            Registry.load(loaded.settings.registry, loaded.settings.models_dir)
    except (ConfigError, ValueError) as exc:
        print(f"hydrad: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        try:
            warnings = pool_warnings(loaded.settings, args.coordinator_config)
        except (ValueError, OSError) as exc:  # the coordinator's files, not this one, are broken
            print(f"hydrad: --coordinator-config: {exc}", file=sys.stderr)
            return 2
        for text in warnings:
            print(f"hydrad: warning: {args.check_config}: {text}", file=sys.stderr)
        print(f"{args.check_config}: ok" + (f" ({len(warnings)} warning{'s' if len(warnings) > 1 else ''})"
                                             if warnings else ""))
        return 0
    if args.print_config:
        if args.json:
            print(json.dumps({"settings": loaded.sources(), "defaults": loaded.settings.defaults}, indent=2, default=str))
        else:
            _print_config(loaded)
        return 0
    setup_logging(loaded.settings.logging.level)
    bind_devices(loaded.settings.device, os.environ)
    set_cuda_switches({name: getattr(loaded.settings, name) for name in CUDA_SWITCHES}, os.environ)
    # The engine thread and the event loop hand work to each other every decode step; a shorter GIL
    # switch interval than Python's 5 ms keeps each from waiting long for the other's Python parts.
    sys.setswitchinterval(loaded.settings.switch_interval_ms / 1000)
    try:
        daemon = Daemon(loaded)
    except StoreError as exc:  # prefix.store names a directory the engine cannot use
        print(f"hydrad: prefix.store: {exc}", file=sys.stderr)
        return 2
    return run_loop(daemon.run())


if __name__ == "__main__":
    sys.exit(main())

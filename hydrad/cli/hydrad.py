"""``hydrad``: the engine daemon's command line (run, ``--check-config``, ``--print-config``), its
own flags and llama-server's (:mod:`hydrad.cli.llamaflags`), so that a llama-server command line
starts the same engine under hydrad.

It sits above both planes because ``--check-config --coordinator-config`` reads the pool's
coordinator config too; the daemon itself is ``hydrad.engine.daemon``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

import yaml

from hydrad import __version__
from hydrad.cli import llamaflags
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


class _Parser(argparse.ArgumentParser):
    """One line on a bad command line, naming the flag (exit 2), as every other refusal of hydrad's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"hydrad: {message} (hydrad --help lists the flags)\n")

    def _match_argument(self, action: argparse.Action, pattern: str) -> int:
        # a refused flag given without its value is still refused for what it is, not for the value
        try:
            return super()._match_argument(action, pattern)  # type: ignore[misc]
        except argparse.ArgumentError:
            llamaflags.refuse_alone(self, action)
            raise


USAGE = ("hydrad [--config FILE] [LLAMA-SERVER FLAGS ...] | --check-config FILE [--coordinator-config FILE] | "
         "--print-config FILE [--json]")


def build_parser() -> argparse.ArgumentParser:
    """hydrad's command line (also read by scripts/gen_docs for docs/reference/cli.md): its own
    flags, then llama-server's (hydrad.cli.llamaflags)."""
    ap = _Parser(prog="hydrad", usage=USAGE, add_help=False, allow_abbrev=False,
                 description="Hydra engine daemon: one per GPU. Configured by a YAML file (--config), by "
                             "llama-server's flags (hydrad -m model.gguf --port 8080 -c 4096), or both: the "
                             "file's settings win over the flags' where both set one.")
    own = ap.add_argument_group("hydrad's own flags")
    own.add_argument("-h", "--help", "--usage", action="help", help="show this help and exit")
    own.add_argument("--config", metavar="FILE", help="engine YAML (e.g. /etc/hydra/5060ti.yaml); where it and a "
                     "llama-server flag set the same setting, the file's value wins")
    own.add_argument("--check-config", metavar="FILE", help="validate FILE and exit (non-zero naming the bad field)")
    own.add_argument("--coordinator-config", metavar="FILE",
                     help="with --check-config: the pool's coordinator config, to check that this engine can join it")
    own.add_argument("--print-config", metavar="FILE", help="show effective values and where each came from")
    own.add_argument("--json", action="store_true", help="with --print-config: JSON instead of YAML")
    own.add_argument("--version", action="version", version=f"hydrad {__version__}")
    llamaflags.add_to(ap)
    return ap


# llama-server reads its flags from these too; hydrad does not, and says so rather than start
# an engine other than the one they describe.
_LLAMA_ENV = ("LLAMA_ARG_", "LLAMA_API_KEY")


def _llama_environment(env: dict[str, str]) -> list[str]:
    return sorted(k for k, v in env.items() if v and k.startswith(_LLAMA_ENV))


def _overridden(cl: llamaflags.CommandLine, raw: dict[str, object]) -> list[str]:
    """The flags whose setting the config file sets too (the file's value is the one in force)."""
    out = []
    for path, flag in cl.origin.items():
        node: object = raw
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None  # type: ignore[assignment]
        if node is not None:
            out.append(f"{flag} is overridden by the config file's {'.'.join(path)}")
    return out


def main(argv: list[str] | None = None) -> int:
    llama.preload_native()  # before numpy & co. link the C++ runtime: see preload_native
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        flags = llamaflags.read(args.llama_flags)
    except llamaflags.FlagError as exc:
        print(f"hydrad: {exc}", file=sys.stderr)
        return 2
    if flags and (args.check_config or args.print_config):
        print("hydrad: --check-config and --print-config read a file alone; llama-server's flags start an engine",
              file=sys.stderr)
        return 2
    path = args.check_config or args.print_config or args.config
    if not (args.check_config or args.print_config):
        ignored = _llama_environment(dict(os.environ))
        if ignored:
            print(f"hydrad: ${ignored[0]}: llama-server's environment variables are not read here; give its flag "
                  "on the command line (or the setting in a --config file) and unset the variable", file=sys.stderr)
            return 2
    if flags and path is None:
        # The command line alone describes the engine, as llama-server's does: one HTTP port, no
        # merged RPC port (a second engine on the host would find 9503 taken). A file opens it.
        flags.layer.setdefault("rpc", {})["enabled"] = False
    try:
        loaded = load_config(path, flags.layer, flags.api_keys)
        if args.check_config or args.print_config or flags:
            Registry.load(loaded.settings.registry, loaded.settings.models_dir, loaded.settings.models)
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
    for text in flags.warnings + _overridden(flags, loaded.raw):
        print(f"hydrad: warning: {text}", file=sys.stderr)
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

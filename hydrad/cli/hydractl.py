"""``hydractl``: look at and reconfigure one running engine from a shell.

The engine's HTTP plane already says everything; this tool spares operators hand-written
JSON and curl loops, and turns the answers into exit codes that scripts can branch on:

    0  done / serving
    1  the engine cannot be reached (or answered something that is not Hydra)
    2  the engine refused the request (a 4xx: bad field, unknown model, busy, forbidden)
    3  reachable but not serving (idle, loading, stopping)
    4  a model load failed

``info``, ``state`` and ``migrate`` speak Hydra's binary ops on the engine's merged RPC port
(``host:port``, docs/rpc-protocol.md) instead of HTTP, with the same exit codes: an error
frame from an engine exits 2, a port that cannot be reached (or does not speak the protocol) 1.

``engines``, ``profile`` and ``route`` ask the coordinator instead (``/admin/*``, default
``http://127.0.0.1:9000`` or ``$HYDRA_COORDINATOR_URL``), with the same exit codes; a profile
switch whose load fails exits 4. ``up`` runs a whole local pool (``hydrad/cli/up.py``).

This module is the entry point: the parser and ``main``. The commands live by subject in
``hydrad/cli/ctl/`` (``engine``, ``kv``, ``coordinator``), over the clients in ``ctl/clients.py``.
"""

from __future__ import annotations

import argparse
import os
import sys

from hydrad.cli.common import COORDINATOR_URL, COORDINATOR_URL_ENV, CliError
from hydrad.cli.ctl import coordinator, engine, kv, store
from hydrad.cli.ctl.clients import DEFAULT_URL, TOKEN_ENV, TOKEN_FILE_ENV, URL_ENV


def cmd_up(args: argparse.Namespace) -> int:
    from hydrad.cli import up  # the local-cluster runner; only this command needs it

    return up.run(args)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="seconds to wait for each HTTP answer (default 30)")
    ap = argparse.ArgumentParser(
        prog="hydractl", description="Look at and reconfigure a running Hydra engine (hydrad).",
        epilog="exit codes: 0 ok, 1 unreachable, 2 refused (4xx or an RPC error frame), 3 not serving, "
               "4 model load failed",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rpc_auth = argparse.ArgumentParser(add_help=False)
    rpc_auth.add_argument("--token", metavar="T",
                          help=f"the engines' token, rpc.token (default ${TOKEN_ENV}; prefer --token-file)")
    rpc_auth.add_argument("--token-file", metavar="FILE",
                          help=f"read the engines' token from FILE (default ${TOKEN_FILE_ENV}), e.g. /etc/hydra/engine.token")
    engine.add_parsers(sub, common, rpc_auth)
    kv.add_parsers(sub, common, rpc_auth)
    coordinator.add_parsers(sub, common, rpc_auth)
    store.add_parsers(sub)

    up = sub.add_parser("up", help="run a local pool: the coordinator and its engines as subprocesses",
                        description="Start hydra-coordinator and the engines its profiles name (<config-dir>/<engine>.yaml)\n"
                                    "as local processes, without systemd; wait until every engine is alive and the\n"
                                    "profile is applied, print the OpenAI endpoint, and run until Ctrl-C or SIGTERM,\n"
                                    "which stop every process (SIGTERM, then SIGKILL after --stop-timeout).\n"
                                    "Exit 0 after a requested stop, 1 when start-up fails (a process died, a port is\n"
                                    "taken, time ran out), 2 for a bad config, 130 when interrupted during start-up.",
                        epilog="examples:\n  hydractl up\n  hydractl up --profile swapped --logs ~/hydra-logs\n"
                               "  hydractl up --port-offset 1000      # every port of the configs + 1000",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--config-dir", metavar="DIR", default=None,
                    help="coordinator.yaml, profiles and one <engine>.yaml per engine (default etc/hydra/dev)")
    up.add_argument("--profile", metavar="NAME", help="profile to apply at start (default: the coordinator's)")
    up.add_argument("--logs", metavar="DIR", help="write each process's log to DIR/<name>.log instead of the terminal")
    up.add_argument("--port-offset", type=int, default=0, metavar="N",
                    help="add N to every port of the configs (run beside another pool)")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds start-up may take, models loaded (default 300)")
    up.add_argument("--stop-timeout", type=float, default=20.0, metavar="S",
                    help="seconds to wait after SIGTERM before SIGKILL (default 20)")
    up.set_defaults(func=cmd_up)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra:  # words after an option: only commands taking free text (route's PROMPT) accept them
        if not getattr(args, "intermixed", False) or any(x.startswith("-") for x in extra):
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = list(args.args) + extra
    args.default_url = os.environ.get(URL_ENV) or DEFAULT_URL
    args.default_coordinator_url = os.environ.get(COORDINATOR_URL_ENV) or COORDINATOR_URL
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"hydractl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

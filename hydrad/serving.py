"""What both daemons (engine and coordinator) need to serve HTTP under systemd."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Coroutine, Iterator


def uvicorn_server(app: Any, host: str, port: int) -> Any:
    """A uvicorn server without its own signal handling: the daemon owns SIGTERM/SIGINT/SIGHUP.

    No proxy headers: ``control_allow_from`` must see the socket's peer, not a claimed X-Forwarded-For.
    """
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off", proxy_headers=False,
                         timeout_graceful_shutdown=5, timeout_keep_alive=30)
    return Server(cfg)


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run a daemon's main coroutine on uvloop when it is installed (less CPU per streamed chunk)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)

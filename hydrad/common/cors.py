"""CORS for the inference endpoints of both daemons, so a web page on a configured origin can call
the OpenAI and llama-server endpoints as it would llama-server's (``--cors``-style).

Only inference: the control surfaces (an engine's ``/control/*`` and ``/slots/*``, the coordinator's ``/models/files/*``, the
coordinator's ``/admin/*``) never answer a browser's preflight, so a page on an allowed origin
cannot reconfigure a pool through its visitor's browser on the pool's own host. No origin is
allowed unless configured.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.middleware.cors import CORSMiddleware

CONTROL_PREFIXES = ("/control", "/slots", "/admin", "/models/files/")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")


def check_origins(origins: list[str]) -> list[str]:
    """A settings validator: each entry ``*`` or ``scheme://host[:port]`` (what browsers send)."""
    for o in origins:
        if o != "*" and not _ORIGIN.match(o):
            raise ValueError(f"{o!r} is not an origin (scheme://host[:port], or *)")
    return origins


def with_cors(app: Any, origins: list[str]) -> Any:
    """``app`` with CORS answered for ``origins`` on every path but the control surfaces."""
    if not origins:
        return app
    cors = CORSMiddleware(app, allow_origins=origins, allow_methods=["GET", "POST", "OPTIONS"],
                          allow_headers=["Authorization", "Content-Type", "X-Session-Id"],
                          expose_headers=["X-Session-Id"], max_age=600)

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(CONTROL_PREFIXES):
            await cors(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi

"""CORS for the inference endpoints of both daemons, so a web page on a configured origin can call
the OpenAI and llama-server endpoints as it would llama-server's (``--cors``-style).

Only inference: the control surfaces (an engine's ``/control/*`` and ``/slots/*``, the coordinator's ``/models/files/*``, the
coordinator's ``/admin/*``) never answer a browser's preflight, so a page on an allowed origin
cannot reconfigure a pool through its visitor's browser on the pool's own host. No origin is
allowed unless configured. ``localhost`` in the list (llama-server's keyword) allows the loopback
origins of any port (``http://localhost:3000``, ``http://127.0.0.1``, ``http://[::1]:8080``), and
nothing that merely starts with those names.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) on an inference path is answered
200 whatever its origin, as llama-server answers it: with the CORS headers when the origin is
allowed, without them otherwise (the browser then refuses the page's request). The control
surfaces answer no preflight.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.middleware.cors import CORSMiddleware

CONTROL_PREFIXES = ("/control", "/slots", "/admin", "/models/files/")
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")
LOOPBACK = "localhost"
"""The keyword for every loopback origin, of any port."""
_LOOPBACK = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?$")


def check_origins(origins: list[str]) -> list[str]:
    """A settings validator: each entry ``*``, ``localhost`` or ``scheme://host[:port]`` (what browsers send)."""
    for o in origins:
        if o not in ("*", LOOPBACK) and not _ORIGIN.match(o):
            raise ValueError(f"{o!r} is not an origin (scheme://host[:port], localhost for every loopback origin, "
                             "or *)")
    return origins


def is_loopback(origin: str) -> bool:
    """Whether ``origin`` is one that the ``localhost`` keyword allows."""
    return _LOOPBACK.match(origin.strip().lower()) is not None


def _preflight(scope: dict[str, Any]) -> str | None:
    """The origin of a CORS preflight (None: not one)."""
    if scope.get("method") != "OPTIONS":
        return None
    origin = asked = None
    for key, value in scope.get("headers") or ():
        if key == b"origin":
            origin = value.decode("latin-1")
        elif key == b"access-control-request-method":
            asked = True
    return origin if origin is not None and asked else None


def with_cors(app: Any, origins: list[str]) -> Any:
    """``app`` with CORS answered for ``origins`` on every path but the control surfaces."""
    cors = CORSMiddleware(app, allow_origins=[o for o in origins if o != LOOPBACK],
                          allow_origin_regex=_LOOPBACK.pattern if LOOPBACK in origins else None,
                          allow_methods=["GET", "POST", "OPTIONS"],
                          allow_headers=["Authorization", "Content-Type", "X-Session-Id"],
                          expose_headers=["X-Session-Id"], max_age=600)

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith(CONTROL_PREFIXES):
            await app(scope, receive, send)
            return
        origin = _preflight(scope)
        if origin is not None and not (origins and cors.is_allowed_origin(origin)):
            # answered, granting nothing: no CORS header, so the browser keeps the page's request back
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"0"), (b"vary", b"Origin")]})
            await send({"type": "http.response.body", "body": b""})
        elif origins:
            await cors(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi

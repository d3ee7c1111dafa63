"""The browser-origin defence in front of both daemons' HTTP doors, token or not.

A web page the user opens can make the browser send requests to any address, loopback included,
and two kinds of them reach a server without the page ever being allowed to read an answer:

- **cross-site "simple" requests**: a POST with ``Content-Type: text/plain``, a form's
  ``application/x-www-form-urlencoded`` or ``multipart/form-data`` needs no CORS preflight, so
  a page on ``http://evil.example`` could switch the pool's profile or reconfigure a token-less
  engine by posting JSON text to it;
- **DNS rebinding**: a page whose own name is made to resolve to 127.0.0.1 is, to the browser,
  the same origin as the pool, and may read and drive the whole API. Its requests carry the
  page's name in ``Host``.

So every request passes three checks here, before any route (or the API key, or CORS) runs:

1. ``Host`` must name this server: an IP literal (a browser that sends one connected to that
   address itself; no name was rebound), ``localhost`` or a ``*.localhost`` name (browsers
   resolve those to loopback themselves), the listen address, this machine's host name, or a
   name in ``http.allowed_hosts`` (``*`` turns the check off). Anything else is 403.
2. A request that can change state (any method but GET, HEAD and OPTIONS) from a browser on
   another origin is 403: its ``Origin`` is neither this server's own (the ``Host`` it was sent
   to) nor in ``http.cors_origins``, or it has no ``Origin`` and ``Sec-Fetch-Site`` says
   ``cross-site`` / ``same-site``. The control surfaces (``/control``, ``/slots``, ``/admin``)
   take no cross-origin request at all, configured origins included: CORS is for inference.
3. Such a request with one of the three content types a page may send without a preflight
   (``text/plain``, form encodings) is 415. A JSON body says ``application/json`` (or sends no
   ``Content-Type``, as scripts do); binary bodies (KV state) keep their own types, which a page
   cannot send cross-site without a preflight that no control surface answers.

Clients that are not browsers send no ``Origin`` and no ``Sec-Fetch-Site``, so (2) never
touches them; (3) asks ``curl -d`` users for ``-H 'Content-Type: application/json'``, as
FastAPI-based servers do. Every refusal is OpenAI-style error JSON with ``Connection: close``.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from hydrad.common import cors
from hydrad.common.cors import CONTROL_PREFIXES

SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
"""What a page may POST to any address without a CORS preflight (the Fetch standard's list)."""
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}

Send = Callable[[dict[str, Any]], Awaitable[None]]


class HostAccess(BaseModel):
    """The ``http`` settings of both daemons that say which names the server answers to."""

    allowed_hosts: list[str] = Field(default_factory=list, description="Host names (besides IP addresses, localhost "
                                     "names, the listen address and this machine's host name) that requests may be "
                                     "addressed to in their Host header: 'gpu1.lan', or '.example.com' for every name "
                                     "under it; '*' allows any. Other names are refused (403), which stops DNS "
                                     "rebinding from a web page.")

    @field_validator("allowed_hosts")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or any(c.isspace() or c in "/:@" for c in name):
                raise ValueError(f"{name!r} is not a host name (a name, '.domain' for every name under it, or *)")
        return [n.lower().rstrip(".") if n != "*" else n for n in v]


def _host_name(value: str) -> str:
    """A ``Host`` header's (or an origin's) name: lower case, no port, no brackets, no final dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _netloc(scheme: str, value: str) -> str:
    """``host[:port]`` lower-cased, with the scheme's default port left out, for comparing an
    origin with the ``Host`` a request was sent to."""
    value = value.strip().lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default is not None and value.endswith(":" + default) and not value.endswith("]"):
        value = value[: -len(default) - 1]
    return value


class HostCheck:
    """Which ``Host`` names this server answers to (the module's rule 1)."""

    def __init__(self, listen_host: str, allowed: list[str]) -> None:
        self.any = "*" in allowed
        names = {n for n in allowed if not n.startswith(".")} | LOCAL_NAMES
        listen = _host_name(listen_host)
        if listen and not _is_ip(listen):
            names.add(listen)
        try:
            names.add(socket.gethostname().lower().rstrip("."))
        except OSError:
            pass
        self.names = frozenset(names)
        self.suffixes = tuple(n for n in allowed if n.startswith(".")) + (".localhost",)

    def allows(self, host: str) -> bool:
        if self.any:
            return True
        name = _host_name(host)
        return _is_ip(name) or name in self.names or name.endswith(self.suffixes)


def _refusal(status: int, message: str, code: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                 "param": None}}).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]}
    return start, body


class BrowserGuard:
    """The module's three checks as one pure ASGI middleware (streamed answers pass untouched)."""

    def __init__(self, app: Any, *, listen_host: str, allowed_hosts: list[str], cors_origins: list[str]) -> None:
        self.app = app
        self.hosts = HostCheck(listen_host, allowed_hosts)
        self.any_origin = "*" in cors_origins
        self.origins = frozenset(o.lower().rstrip("/") for o in cors_origins)
        self.loopback = cors.LOOPBACK in cors_origins

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope.get("type") == "http":
            why = self.refusal(scope)
            if why is not None:
                start, body = _refusal(*why)
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict[str, Any]) -> tuple[int, str, str] | None:
        """(status, message, code) for a request this server must not serve, else None."""
        host = origin = site = ctype = None
        for key, value in scope.get("headers") or ():
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
            elif key == b"sec-fetch-site":
                site = value.decode("latin-1").strip().lower()
            elif key == b"content-type":
                ctype = value.decode("latin-1")
        if host is not None and not self.hosts.allows(host):
            return (403, f"this server does not answer to the host name '{_host_name(host)[:200]}'; an operator "
                    "adds it to http.allowed_hosts (names are checked against DNS rebinding)", "host_not_allowed")
        method = scope.get("method", "GET").encode("latin-1")
        if method in SAFE_METHODS:
            return None
        path = scope.get("path", "")
        if self._foreign(origin, site, host, path.startswith(CONTROL_PREFIXES)):
            shown = (origin or f"a {site} page")[:200]
            return (403, f"{scope.get('method')} {path[:200]} from {shown} is refused: requests that change state are "
                    "accepted from this server's own origin, or on inference endpoints from an origin in "
                    "http.cors_origins", "cross_origin")
        if ctype is not None and ctype.split(";", 1)[0].strip().lower() in SIMPLE_TYPES:
            return (415, f"Content-Type '{ctype.split(';', 1)[0].strip()[:100]}' is not accepted here: send JSON as "
                    "'Content-Type: application/json' (curl: -H 'Content-Type: application/json')",
                    "unsupported_media_type")
        return None

    def _foreign(self, origin: str | None, site: str | None, host: str | None, control: bool) -> bool:
        if origin is None:
            return site in ("cross-site", "same-site")
        try:
            parts = urlsplit(origin.strip())
        except ValueError:  # not an origin a browser sends ("http://[::1" ...): nobody's own
            return True
        if host is not None and parts.scheme in _DEFAULT_PORTS and parts.netloc \
                and _netloc(parts.scheme, parts.netloc) == _netloc(parts.scheme, host):
            return False  # same origin: the page was served by this server (or its proxy) itself
        if control:
            return True
        return not (self.any_origin or origin.strip().lower().rstrip("/") in self.origins
                    or (self.loopback and cors.is_loopback(origin)))


"""The coordinator's HTTP gate: who may call ``/admin/*``, and how big and how slow a body may be.

One pure ASGI middleware in front of every route (not Starlette's ``BaseHTTPMiddleware``, which
would buffer streamed responses), so no handler can forget a check:

- ``/admin/*`` (switching profiles, explaining routes, listing engines) answers only clients
  whose address is in ``admin_allow_from`` (default loopback; else 403), and, when an admin
  token is configured (``admin_token_file``), only requests carrying
  ``Authorization: Bearer <token>`` (else 401 with ``WWW-Authenticate: Bearer``). Both checks
  happen before the route runs, for unknown ``/admin`` paths too, so probing learns nothing.
  The address is the socket's peer: the server trusts no proxy header.
- A body larger than ``max_body_bytes`` is refused with 413: at once when ``Content-Length``
  says so (before a byte of it is read), else as soon as the bytes received pass the limit;
  the front door never parses or forwards it. A body still arriving ``body_timeout_s`` after
  the request began gets 408. Both guard the coordinator (memory, a task per slow client) and
  the engines behind it (a message too large for the bus must never be sent).

Every refusal is OpenAI-style error JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable

from hydrad.common import tokenfile
from hydrad.common.netaccess import address_allowed
from hydrad.wire.openai import ApiError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _refuse(send: Send, err: ApiError) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _is_admin(path: str) -> bool:
    return path == "/admin" or path.startswith("/admin/")


class Guard:
    def __init__(self, app: Any, *, admin_allow_from: list[str], admin_token: str | None,
                 max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.allow = list(admin_allow_from)
        self.token = admin_token
        self.max_body = max_body_bytes
        self.body_timeout = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if _is_admin(scope.get("path", "")):
            err = self._admin_refusal(scope)
            if err is not None:
                await _refuse(send, err)
                return
        length = None
        for key, value in scope.get("headers") or ():
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _refuse(send, ApiError(400, "Content-Length is not a number", "invalid_request"))
                    return
        if length is not None and length > self.max_body:
            await _refuse(send, self._too_large(length))
            return
        await self.app(scope, self._limited(receive), send)

    def _admin_refusal(self, scope: Scope) -> ApiError | None:
        client = scope.get("client")
        host = client[0] if client else None
        if not address_allowed(host, self.allow):
            return ApiError(403, f"/admin is not open to {host or 'this client'} (admin_allow_from)", "forbidden")
        if self.token is None:
            return None
        given = None
        for key, value in scope.get("headers") or ():
            if key == b"authorization":
                scheme, _, rest = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    given = rest.strip()
        if not tokenfile.same(given, self.token):
            why = "a bearer token is required" if given is None else "the bearer token is not valid"
            return ApiError(401, f"/admin: {why} (Authorization: Bearer <admin token>)", "unauthorized",
                            headers={"WWW-Authenticate": 'Bearer realm="hydra-admin"'})
        return None

    def _too_large(self, size: int | None, close: bool = False) -> ApiError:
        """413; ``close``: part of the body was read and the rest is left unread, so the connection ends."""
        what = f"{size} bytes" if size is not None else f"more than {self.max_body} bytes"
        return ApiError(413, f"the request body ({what}) exceeds this coordinator's limit of {self.max_body} bytes "
                             "(max_body_bytes)", "request_too_large", headers={"Connection": "close"} if close else None)

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that counts body bytes and bounds the time until the body is complete.

        Raised errors surface in the handler's ``await request.body()`` and become JSON there.
        Once the body is complete (or for ``http.disconnect``) it is a plain pass-through, so
        the handler's wait for a disconnect is never cut short.
        """
        received = 0
        complete = False
        deadline = time.monotonic() + self.body_timeout

        async def wrapped() -> dict[str, Any]:
            nonlocal received, complete
            if complete:
                return await receive()
            remaining = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, remaining))
            except asyncio.TimeoutError:
                # the rest of the body may still come: the connection cannot carry another request
                raise ApiError(408, f"the request body did not arrive within {self.body_timeout:g} s "
                                    "(body_timeout_s)", "timeout", headers={"Connection": "close"}) from None
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > self.max_body:
                    raise self._too_large(None, close=True)
                if not message.get("more_body", False):
                    complete = True
            else:
                complete = True
            return message

        return wrapped

"""A client that closes its connection before its request's body has arrived is an ordinary event,
not a server error.

Starlette answers the ``http.disconnect`` it reads in the middle of a body with ``ClientDisconnect``,
an ``Exception``: every handler's catch-all, and both daemons' crash handler, took it for a bug,
logged it at ERROR with a traceback, counted a 500 for a client that was no longer there, and
uvicorn logged it once more. Here the ``receive`` channel every handler reads through raises
:class:`ClientGone` instead, a ``BaseException`` (like ``CancelledError``) that no ``except
Exception`` takes, so the request's ``finally`` blocks run and it unwinds to this wrapper, which
logs one INFO line without a traceback. Once the body is complete the channel is the server's own:
a disconnect while the answer is made or streamed is the handlers' to see (they cancel the
request, at INFO too).
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from hydrad.common.logs import log_event

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientGone(BaseException):
    """The client went away before its request's body was complete."""


class QuietLeave:
    """ASGI middleware; the outermost one, so nothing between it and the server reports the leave."""

    def __init__(self, app: Any, log: logging.Logger) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        complete = False
        received = 0

        async def watched() -> dict[str, Any]:
            nonlocal complete, received
            message = await receive()
            if complete:
                return message
            if message["type"] == "http.request":
                received += len(message.get("body") or b"")
                complete = not message.get("more_body", False)
            elif message["type"] == "http.disconnect":
                raise ClientGone()
            return message

        try:
            await self.app(scope, watched, send)
        except ClientGone:
            log_event(self.log, logging.INFO, "client disconnected before its request body was complete",
                      path=scope.get("path", ""), received_bytes=received)

"""What both daemons (engine and coordinator) need to serve HTTP under systemd."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Coroutine, Iterator

from hydrad.common import heap
from hydrad.common.clientgone import QuietLeave


def uvicorn_server(app: Any, host: str, port: int, header_timeout_s: float = 10.0,
                   log: logging.Logger | None = None) -> Any:
    """A uvicorn server without its own signal handling: the daemon owns SIGTERM/SIGINT/SIGHUP.

    No proxy headers: ``control_allow_from`` must see the socket's peer, not a claimed X-Forwarded-For.
    ``header_timeout_s`` bounds how long a connection may sit without completing a request
    (uvicorn's keep-alive timer, which also runs for a new connection that has sent nothing):
    1,100 idle half-open connections once took an engine offline. A client that leaves in the
    middle of its request's body is logged at INFO on ``log`` (``clientgone``), never as an error.
    """
    import uvicorn

    app = QuietLeave(app, log or logging.getLogger("hydra.http"))

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off", proxy_headers=False,
                         timeout_graceful_shutdown=5, timeout_keep_alive=header_timeout_s,
                         http=_deadline_protocol(header_timeout_s))
    return Server(cfg)


MIN_BODY_RATE = 1024
"""Bytes a second a request body must average once it has taken longer than the header timeout."""


def _deadline_protocol(timeout_s: float) -> type:
    """uvicorn's httptools protocol with a deadline on unfinished requests.

    uvicorn times out a connection only between requests (keep-alive), not one that connects
    and sends nothing or sends its headers a byte at a time; each such connection holds a file
    descriptor for ever. Here a request's headers must arrive within ``timeout_s`` of its first
    byte (or of the connection), and its body may not pause for longer than ``timeout_s`` nor,
    past its first ``timeout_s``, arrive slower than :data:`MIN_BODY_RATE` on average (a byte
    every few seconds kept a connection open for ever); otherwise the connection is closed. A
    long upload that keeps flowing is never cut."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _in_body = False
        _body_t0 = 0.0
        _body_bytes = 0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._in_body:
                self._body_bytes += len(data)
                elapsed = time.monotonic() - self._body_t0
                if elapsed > timeout_s and self._body_bytes < elapsed * MIN_BODY_RATE:
                    self._expired()  # trickling: a byte now and then must not hold the connection
                    return
            if self._in_body or (self._deadline is None and (self.cycle is None or self.cycle.response_complete)):
                self._arm()  # a new request starts, or its body is still flowing
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._in_body = True
            self._body_t0 = time.monotonic()
            self._body_bytes = 0
            self._arm()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_body = False
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return DeadlineProtocol


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run a daemon's main coroutine on uvloop when it is installed (less CPU per streamed chunk).
    Everything imported by now is left out of the collector's full passes (:mod:`hydrad.common.heap`)."""
    heap.settle()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class BodyTooLarge(Exception):
    """A request body over the daemon's limit (answered 413 by the caller)."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        what = f"{declared} bytes" if declared is not None else "more"
        super().__init__(f"the request body is {what}; this server accepts at most {limit} bytes")
        self.limit = limit


async def read_body(request: Any, limit: int) -> bytes:
    """The body of a Starlette request, refused as soon as it is known to exceed ``limit``:
    from ``Content-Length`` before a byte is read, else while it streams in. Without this a
    50 MB prompt was read, parsed and tokenized in full before anything could refuse it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, int(declared))
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


async def until_disconnected(request: Any) -> None:
    """Return when the client of a request whose body was read has gone away.

    A non-streaming answer is written only at the end, so nothing else notices a client that
    gave up; without this its request kept generating to ``max_tokens``."""
    await disconnect_of(request.receive)


class CancelOnLeave:
    """``async with CancelOnLeave(receive):`` cancels the task that entered when the client of an ASGI
    ``receive`` channel disconnects, and ends the block quietly then (``left`` says it happened).

    The task doing the work is the handler's own and a plain watcher cancels it: a task for the work
    beside the watcher cost a pass of the loop and ~0.1 ms per request. The watcher cancels only
    while the block runs, so a cancellation never lands after it has ended; a cancellation from
    anywhere else passes through."""

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self._inside = False
        self.left = False

    async def __aenter__(self) -> "CancelOnLeave":
        self._task = asyncio.current_task()
        assert self._task is not None
        self._inside = True
        self._watcher = asyncio.ensure_future(self._watch())
        return self

    async def _watch(self) -> None:
        await disconnect_of(self._receive)
        if self._inside:
            self.left = True
            assert self._task is not None
            self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        self._inside = False
        assert self._watcher is not None and self._task is not None
        self._watcher.cancel()
        if kind is not None and issubclass(kind, asyncio.CancelledError) and self.left:
            self._task.uncancel()  # the client left: the block ends here, quietly
            return True
        return False


async def disconnect_of(receive: Any) -> None:
    """Read an ASGI ``receive`` channel until its ``http.disconnect``."""
    while (await receive())["type"] != "http.disconnect":
        pass


"""The console's two links to the coordinator: the admin HTTP API and the PUB event stream.

Both are blocking and meant to run in Textual thread workers, never on the UI's event loop:

- :class:`AdminClient` wraps ``GET /admin/engines``, ``GET /admin/profile`` and
  ``POST /admin/profile``; every failure (refused, timeout, non-JSON, HTTP error) becomes one
  :class:`AdminError` whose text an operator can act on.
- :class:`EngineClient` reads one engine's own ``GET /control/config`` and ``GET /slots`` (at the
  HTTP address the admin API lists) for the engine detail screen.
- Both go through the HTTP clients ``hydractl`` uses too (``hydrad.wire.httpapi``); only the
  wording of failures is the console's.
- :class:`EventReader` owns a ZeroMQ SUB socket (and its monitor socket) on the thread that
  calls :meth:`EventReader.run`; pyzmq sockets are not thread-safe, so they never leave it.
  Events are handed on in small batches (a burst of routing decisions becomes one UI message,
  not hundreds), and connection changes are reported as they happen. ZeroMQ reconnects on its
  own, with a back-off capped at ``reconnect_max_s``. It presents the events token
  (``hydrad.wire.eventsauth``): without it the coordinator admits no subscriber.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import zmq

from hydrad.common import tokenfile
from hydrad.wire import eventsauth, messages as M
from hydrad.wire.busevents import Event
from hydrad.wire.httpapi import AdminHttp, EngineHttp, NoAnswer, json_of


class AdminError(Exception):
    """An admin call that did not give an answer; ``str()`` says why, ``status`` is the HTTP status if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    """Blocking client of the coordinator's ``/admin`` API (call it from a thread worker)."""

    def __init__(self, base_url: str, *, timeout: float = 5.0, transport: httpx.BaseTransport | None = None,
                 token: str | None = None) -> None:
        """``token``: the coordinator's admin token, sent as a bearer token (default: from
        ``$HYDRA_ADMIN_TOKEN`` or the file ``$HYDRA_ADMIN_TOKEN_FILE`` names, if set)."""
        self.base_url = base_url.rstrip("/")
        if token is None:
            try:
                token = tokenfile.admin_token_from_env()
            except tokenfile.TokenError:
                token = None  # the calls then fail with the coordinator's 401, which says what is missing
        self._api = AdminHttp(self.base_url, timeout=timeout, transport=transport, token=token)

    def engines(self) -> dict[str, Any]:
        return self._call("GET", "/admin/engines", self._api.engines)

    def profile(self) -> dict[str, Any]:
        return self._call("GET", "/admin/profile", self._api.profile)

    def switch(self, name: str) -> dict[str, Any]:
        """Start a switch to profile ``name`` and return at once (progress comes as events)."""
        return self._call("POST", "/admin/profile", lambda: self._api.switch(name, wait=False))

    def close(self) -> None:
        self._api.close()

    def _call(self, method: str, path: str, send: Callable[[], httpx.Response]) -> dict[str, Any]:
        r, body = _exchange(send, no_answer=f"{self.base_url}{path}: no answer in time",
                            unreachable=f"{self.base_url}: ")
        if r.status_code >= 400:
            raise AdminError(f"{method} {path}: HTTP {r.status_code}: "
                             f"{_error_message(body) or r.text[:200] or r.reason_phrase}", r.status_code)
        if not isinstance(body, dict):
            raise AdminError(f"{method} {path}: the answer is not a JSON object")
        return body


def engine_base_url(http: str | None, admin_url: str) -> str | None:
    """The engine's HTTP address as the admin API gives it (``host:port``) as a URL this host can use.

    An engine bound to every address (``0.0.0.0``, ``::``) is reached through the coordinator's
    host, the one host the console knows to be on the engine's network.
    """
    if not http:
        return None
    addr = http.strip()
    if "://" in addr:
        return addr.rstrip("/")
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        host = httpx.URL(admin_url).host or "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EngineClient:
    """Blocking client of one engine's own HTTP API (``/control/config``, ``/slots``), for the detail screen."""

    def __init__(self, *, timeout: float = 3.0, transport: httpx.BaseTransport | None = None,
                 token: str | None = None) -> None:
        """``token``: the engines' token (their ``rpc.token_file``), which ``/control/config`` needs on an
        engine that has one; default ``$HYDRA_TOKEN`` or the file ``$HYDRA_TOKEN_FILE`` names."""
        if token is None:
            token = os.environ.get("HYDRA_TOKEN") or None
            path = os.environ.get("HYDRA_TOKEN_FILE")
            if token is None and path:
                try:
                    token = tokenfile.read_token(path)
                except tokenfile.TokenError:
                    token = None  # the call then fails with the engine's 401, which says what is missing
        self._api = EngineHttp(timeout=timeout, transport=transport, token=token)

    def config(self, base_url: str) -> dict[str, Any]:
        """``GET /control/config``: every runtime parameter with its value, source layer and tier."""
        body = self._get(base_url, "/control/config", lambda: self._api.config(base=base_url))
        if not isinstance(body, dict):
            raise AdminError("GET /control/config: the answer is not a JSON object")
        return body

    def slots(self, base_url: str) -> list[dict[str, Any]]:
        body = self._get(base_url, "/slots", lambda: self._api.slots(base=base_url))
        if not isinstance(body, list):
            raise AdminError("GET /slots: the answer is not a JSON list")
        return [s for s in body if isinstance(s, dict)]

    def close(self) -> None:
        self._api.close()

    def _get(self, base_url: str, path: str, send: Callable[[], httpx.Response] | None = None) -> Any:
        """GET ``path`` of the engine at ``base_url`` (through ``send``, one of the client's calls, when given)."""
        r, body = _exchange(send or (lambda: self._api.send("GET", path, base=base_url)), no_answer=f"the engine at {base_url} gave no answer in time",
                            unreachable=f"cannot reach the engine at {base_url}: ")
        if r.status_code == 403:
            message = _error_message(body) or r.text[:200]
            raise AdminError(f"the engine refuses {path} from this host (its control_allow_from does not list it): "
                             f"{message}", 403)
        if r.status_code >= 400:
            raise AdminError(f"GET {path}: HTTP {r.status_code}: {_error_message(body) or r.text[:200] or r.reason_phrase}",
                             r.status_code)
        return body


def _exchange(send: Callable[[], httpx.Response], *, no_answer: str, unreachable: str) -> tuple[httpx.Response, Any]:
    """One request: the response and its JSON body (None when it is not JSON), or an AdminError
    saying why no answer came (``unreachable`` is followed by the transport's reason)."""
    try:
        r = send()
    except NoAnswer as exc:
        raise AdminError(no_answer if exc.timeout else unreachable + _transport_reason(exc.cause)) from None
    return r, json_of(r)


def _error_message(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    return err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None


def _transport_reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low:
        return "unknown host"
    return text


@dataclass(frozen=True)
class FeedEvent:
    topic: str
    ts: float
    data: dict[str, Any]


# connection states reported by EventReader
CONNECTING, CONNECTED, DISCONNECTED = "connecting", "connected", "disconnected"


class EventReader:
    """SUB reader: call :meth:`run` on the thread that should own the sockets."""

    def __init__(self, endpoint: str, *, curve_server_key: str | None = None, token: str | None = None,
                 reconnect_max_s: float = 2.0, batch_s: float = 0.05, context: zmq.Context | None = None) -> None:
        """``token``: the events token the coordinator asks of subscribers (None: none is presented,
        and the coordinator refuses the connection, which the state reports)."""
        self.endpoint = endpoint
        self.curve_server_key = curve_server_key
        self.token = token
        self.reconnect_max_s = reconnect_max_s
        self.batch_s = batch_s
        self._ctx = context
        self.dropped = 0  # frames that were not events of this protocol

    def run(self, on_events: Callable[[list[FeedEvent]], None], on_state: Callable[[str, str], None],
            should_stop: Callable[[], bool]) -> None:
        """Read until ``should_stop()``; ``on_state(state, detail)`` on connection changes."""
        own = self._ctx is None
        ctx = zmq.Context() if own else self._ctx
        assert ctx is not None
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 10_000)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(self.reconnect_max_s * 1000))
        sub.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        eventsauth.present(sub, self.token, self.curve_server_key)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
                                         | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                         | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        state = CONNECTING
        on_state(state, f"connecting to {self.endpoint}")
        try:
            sub.connect(self.endpoint)
            batch: list[FeedEvent] = []
            flush_at = 0.0
            while not should_stop():
                timeout = 100 if not batch else max(0, int((flush_at - time.monotonic()) * 1000))
                ready = dict(poller.poll(timeout))
                if monitor in ready:
                    new = self._monitor(monitor, state)
                    if new is not None and new[0] != state:
                        state = new[0]
                        on_state(*new)
                if sub in ready:
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        ev = self._decode(frames)
                        if ev is not None:
                            if not batch:
                                flush_at = time.monotonic() + self.batch_s
                            batch.append(ev)
                        if len(batch) >= 500:
                            break
                if batch and (time.monotonic() >= flush_at or len(batch) >= 500):
                    on_events(batch)
                    batch = []
        finally:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)
            if own:
                ctx.term()

    def _monitor(self, monitor: zmq.Socket, state: str) -> tuple[str, str] | None:
        from zmq.utils.monitor import recv_monitor_message

        try:
            msg = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return None
        event = msg.get("event")
        if event == zmq.EVENT_CONNECTED:
            return CONNECTED, f"connected to {self.endpoint}"
        if event == zmq.EVENT_DISCONNECTED:
            return DISCONNECTED, f"lost {self.endpoint}; reconnecting"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and not self.token):
            what = "no events token was presented" if not self.token else "the events token was refused"
            return DISCONNECTED, f"{self.endpoint}: {what} (HYDRA_EVENTS_TOKEN_FILE)"
        if event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return DISCONNECTED, f"{self.endpoint}: handshake failed (CURVE server key?)"
        if event == zmq.EVENT_CONNECT_RETRIED and state != CONNECTED:
            return DISCONNECTED, f"{self.endpoint} not reachable; retrying"
        return None

    def _decode(self, frames: list[bytes]) -> FeedEvent | None:
        try:
            ev = Event.from_frames(frames)
        except M.BusDecodeError:
            self.dropped += 1
            return None
        return FeedEvent(ev.topic, ev.ts, ev.data)


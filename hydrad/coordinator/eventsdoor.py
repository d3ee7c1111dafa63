"""The coordinator's events socket: who may subscribe, and what the events say about sessions.

The events (XPUB) socket tells every subscriber which engine each request went to, why, and
which conversation it belongs to. Both are guarded here:

- **A token to subscribe.** The socket is a ZeroMQ PLAIN server (or CURVE, with the bus's keys)
  under the ZAP domain ``hydra-events``, and a ZAP handler (a thread of its own, never the event
  loop) admits only a subscriber that presents the events token: PLAIN's password, or under
  CURVE the public key derived from the token (``hydrad.wire.eventsauth``). Anyone else fails
  the handshake and receives nothing. The token is read like the pool's other secrets
  (``hydrad.common.tokenfile``): ``$HYDRA_EVENTS_TOKEN_FILE``, else ``events_token_file``, else
  the admin token (the console holds it already), else one the coordinator writes itself, once,
  to ``<state_dir>/<name>.events.token`` (mode 0600) and reuses on later starts. The socket is
  never open.
- **No session ids.** A session id is what a client sends to continue its conversation on the
  engine that holds its KV; a reader of the events must not learn it. Every published ``session``
  (and the id where a routing reason names it) is replaced by a keyed hash: HMAC-SHA256 under a
  key drawn when the coordinator starts, so one session has one tag for as long as the
  coordinator runs (the console still follows it from engine to engine), and the tag cannot be
  turned back into the id, nor checked against a guess, without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85

from hydrad.common import tokenfile
from hydrad.common.logs import LogThrottle, log_event
from hydrad.wire import eventsauth

log = logging.getLogger("hydra.coordinator.events")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks every handshake that needs authenticating


class EventsDoor:
    """The events socket's credentials and its session hashing; one per coordinator."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._curve_public = z85.decode(eventsauth.curve_keypair(token)[0])  # raw, as ZAP gives a client's key
        self._key = secrets.token_bytes(32)  # the session hashes' key: this coordinator's run only
        self._throttle = LogThrottle()
        self.refused = 0  # handshakes refused (tests and logs)
        self._thread: threading.Thread | None = None

    # ----- who may subscribe -----------------------------------------------------------

    def secure(self, pub: zmq.Socket, ctx: zmq.Context, *, curve: bool) -> None:
        """Put ``pub`` (not yet bound) behind the token: PLAIN server unless ``curve`` (the caller set it
        up as a CURVE server), the events' ZAP domain, ZAP made mandatory (no handler: no subscriber),
        and this door's handler bound on ``ctx`` and started."""
        if not curve:
            pub.setsockopt(zmq.PLAIN_SERVER, 1)
        pub.setsockopt(zmq.ZAP_DOMAIN, eventsauth.DOMAIN)
        pub.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        if self._thread is not None:
            return
        sync: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)  # a blocking socket on the bus's context, for the thread
        zap = sync.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)  # bound before the events socket is, so no handshake finds no handler
        self._thread = threading.Thread(target=self._serve, args=(zap,), name="hydra-events-zap", daemon=True)
        self._thread.start()

    def _serve(self, zap: zmq.Socket) -> None:
        """Answer ZAP requests until the context ends (the coordinator closing its bus)."""
        try:
            while True:
                try:
                    frames = zap.recv_multipart()
                except zmq.ContextTerminated:
                    return
                if len(frames) < 6:
                    continue
                request_id, domain, address, mechanism, credentials = frames[1], frames[2], frames[3], frames[5], frames[6:]
                ok = domain != eventsauth.DOMAIN or self._admits(mechanism, credentials)
                if not ok:
                    self.refused += 1
                    self._throttle(log, logging.WARNING, f"refused:{address!r}", "events subscriber refused",
                                   peer=address.decode("ascii", "replace"), mechanism=mechanism.decode("ascii", "replace"),
                                   why="no events token or a wrong one (HYDRA_EVENTS_TOKEN_FILE)")
                try:
                    zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                        b"OK" if ok else b"events token required", b"", b""])
                except zmq.ContextTerminated:
                    return
        finally:
            zap.close(linger=0)

    def _admits(self, mechanism: bytes, credentials: list[bytes]) -> bool:
        if mechanism == b"PLAIN" and len(credentials) == 2:
            user, password = credentials
            return user == eventsauth.USER and tokenfile.same(password.decode("latin-1"), self.token)
        if mechanism == b"CURVE" and len(credentials) == 1:
            return hmac.compare_digest(credentials[0], self._curve_public)
        return False  # NULL: no credentials at all

    # ----- what the events say ---------------------------------------------------------

    def session_tag(self, session: str) -> str:
        """The stable, keyed stand-in for a session id in the events."""
        return "s-" + hmac.new(self._key, session.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]

    def scrub(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with its ``session`` replaced by the session's tag, and the id replaced where a text
        of the event names it (a routing reason: ``session <id> is warm on ...``)."""
        raw = data.get("session")
        if not isinstance(raw, str) or not raw:
            return data
        tag = self.session_tag(raw)
        named, renamed = f"session {raw}", f"session {tag}"

        def clean(value: Any) -> Any:
            if isinstance(value, str):
                return tag if value == raw else value.replace(named, renamed) if named in value else value
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [clean(v) for v in value]
            return value

        return {k: tag if k == "session" else clean(v) for k, v in data.items()}


def events_token(settings: Any, state_dir: Path) -> tuple[str, str]:
    """The events token and where it came from: ``$HYDRA_EVENTS_TOKEN_FILE``, ``events_token_file``,
    the admin token, or a token of the coordinator's own in ``state_dir`` (made on first use, kept
    after). ``TokenError`` naming the file when one cannot be used."""
    env = os.environ.get(tokenfile.ENV_EVENTS_TOKEN_FILE, "").strip()
    path = Path(env) if env else settings.events_token_file
    if path is not None:
        _warn_if_loose(path)
        return tokenfile.read_token(path), str(path)
    if settings.admin_token_file is not None:
        return tokenfile.read_token(settings.admin_token_file), "admin_token_file"
    own = state_dir / f"{settings.name}.events.token"
    try:
        return tokenfile.read_token(own), str(own)
    except tokenfile.TokenError:
        pass
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        token = tokenfile.write_token(own)
    except OSError as exc:
        raise tokenfile.TokenError(f"cannot write the events token {own}: {exc.strerror or exc}; "
                                   "set events_token_file") from None
    log_event(log, logging.INFO, "events token written; a console presents it with HYDRA_EVENTS_TOKEN_FILE",
              path=str(own))
    return token, str(own)


def _warn_if_loose(path: Path) -> None:
    if tokenfile.loose_permissions(path):
        log_event(log, logging.WARNING, "the events token file is readable by every user; chmod 600 it",
                  path=str(path))

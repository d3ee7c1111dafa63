"""Tell systemd how the engine is doing, over the sd_notify datagram protocol.

hydrad runs as a ``Type=notify`` unit with a watchdog, so readiness, reloads
and liveness have to reach the service manager reliably. We write our own
small client instead of using the ``sdnotify`` package from PyPI because that
package swallows every error silently (a misconfigured unit then looks like a
hung engine), encodes messages as latin-1 (our status lines carry model names
and UTF-8 punctuation) and has no helper for the ``MONOTONIC_USEC`` field that
``RELOADING=1`` needs.

Notifying is best effort by design: a failure to reach systemd must never take
the engine down, so nothing here raises to the caller. Each kind of failure is
logged once at warning level, which keeps a missing socket visible without
flooding the journal from the watchdog loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger("hydrad.common.sdnotify")

# A stalled receiver must not freeze the watchdog thread for good; a send
# that times out is logged like any other failure.
_SEND_TIMEOUT_S = 2.0


def _parse_address(value: str) -> str | None:
    """Map a ``NOTIFY_SOCKET`` value to an ``AF_UNIX`` address, or None.

    Only filesystem paths and abstract names are supported; other forms
    (such as ``vsock:``) are not used on the hosts we deploy to.
    """
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def _parse_watchdog_usec(environ: Mapping[str, str]) -> int | None:
    """Return the watchdog period meant for this process, in microseconds.

    ``WATCHDOG_PID`` lets systemd address the watchdog to one process; a
    child that merely inherited the environment must not answer for it.
    """
    raw_usec = environ.get("WATCHDOG_USEC")
    if not raw_usec:
        return None
    raw_pid = environ.get("WATCHDOG_PID")
    if raw_pid:
        try:
            if int(raw_pid) != os.getpid():
                return None
        except ValueError:
            log.warning("ignoring watchdog: WATCHDOG_PID=%r is not a number", raw_pid)
            return None
    try:
        usec = int(raw_usec)
    except ValueError:
        log.warning("ignoring watchdog: WATCHDOG_USEC=%r is not a number", raw_usec)
        return None
    return usec if usec > 0 else None


def _format_value(value: object) -> str:
    """Render one field value; newlines would start a new field, so flatten them."""
    if isinstance(value, bool):
        text = "1" if value else "0"
    else:
        text = str(value)
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


class Notifier:
    """Send state changes to systemd; does nothing when not run under it."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        """Use ``address`` as the notify socket (None disables all sending).

        ``address`` is an ``AF_UNIX`` address as the socket module expects it:
        a path, or an abstract name with its leading NUL byte.
        """
        self._address = address
        self._watchdog_usec = watchdog_usec if address is not None else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Build a notifier from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``."""
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        if not raw:
            return cls(None)
        address = _parse_address(raw)
        if address is None:
            log.warning("ignoring unsupported NOTIFY_SOCKET=%r", raw)
            return cls(None)
        return cls(address, _parse_watchdog_usec(env))

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere at all."""
        return self._address is not None

    def send(self, **fields: object) -> None:
        """Send ``KEY=value`` fields as one datagram, e.g. ``send(READY=1)``."""
        self.send_raw("".join(f"{key}={_format_value(value)}\n" for key, value in fields.items()))

    def send_raw(self, text: str) -> None:
        """Send preformatted newline-separated assignments as one datagram."""
        if self._address is None or not text:
            return
        data = text.encode("utf-8")
        with self._lock:
            sock = self._connected()
            if sock is None:
                return
            try:
                sock.send(data)
            except OSError as exc:
                # The receiving socket may have been recreated (daemon-reexec);
                # reconnect on the next message rather than reuse a dead peer.
                self._drop()
                self._warn_once(f"send:{type(exc).__name__}", "sd_notify send failed: %s", exc)

    def ready(self) -> None:
        """Report that startup finished and the engine serves requests."""
        self.send(READY=1)

    def status(self, text: str) -> None:
        """Set the one-line status shown by ``systemctl status``."""
        self.send(STATUS=text)

    def stopping(self) -> None:
        """Report that shutdown has begun."""
        self.send(STOPPING=1)

    def reloading(self) -> None:
        """Report that a reload started; send ``ready()`` when it is done.

        systemd requires the monotonic timestamp in the same datagram to tell
        this reload apart from earlier ones.
        """
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send(RELOADING=1, MONOTONIC_USEC=usec)

    def extend_timeout(self, seconds: float) -> None:
        """Ask for ``seconds`` more before the current start/stop timeout fires."""
        self.send(EXTEND_TIMEOUT_USEC=max(0, round(seconds * 1_000_000)))

    def watchdog(self) -> None:
        """Pet the watchdog."""
        self.send(WATCHDOG=1)

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings: half the period, as systemd advises."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def close(self) -> None:
        """Release the socket; a later message opens a new one."""
        with self._lock:
            self._drop()

    def _connected(self) -> socket.socket | None:
        if self._sock is not None or self._address is None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.settimeout(_SEND_TIMEOUT_S)
        try:
            sock.connect(self._address)
        except OSError as exc:
            sock.close()
            self._warn_once(
                f"connect:{type(exc).__name__}",
                "cannot reach sd_notify socket %r: %s",
                self._printable_address(),
                exc,
            )
            return None
        self._sock = sock
        return sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _warn_once(self, kind: str, fmt: str, *args: object) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        log.warning(fmt, *args)

    def _printable_address(self) -> str:
        address = self._address or ""
        return "@" + address[1:] if address.startswith("\0") else address

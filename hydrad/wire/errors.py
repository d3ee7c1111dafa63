"""Error kinds and the statuses they travel with: one table for the merged port and HTTP.

A KV-state operation fails with a kind (``StateError.kind``); the merged port answers it with a
``Status`` code and the HTTP twins with the HTTP status that code stands for.
"""

from __future__ import annotations

from hydrad.wire.protocol import Status

HTTP_STATUS: dict[Status, int] = {
    Status.ERROR: 500,
    Status.BAD_REQUEST: 400,
    Status.TOO_LARGE: 413,
    Status.UNAUTHORIZED: 401,
    Status.BUSY: 409,
    Status.NOT_FOUND: 404,
    Status.INCOMPATIBLE: 409,
    Status.CONFLICT: 409,
}
"""The HTTP status a merged-port error code stands for."""

STATE_STATUS: dict[str, Status] = {
    "not_found": Status.NOT_FOUND,
    "conflict": Status.CONFLICT,
    "incompatible": Status.INCOMPATIBLE,
    "too_large": Status.TOO_LARGE,
    "failed": Status.ERROR,
}
"""A KV-state failure's kind → the merged port's status for it."""


def state_http_status(kind: str) -> int:
    """A KV-state failure's kind → the HTTP status the HTTP twins answer with."""
    return HTTP_STATUS[STATE_STATUS[kind]]

"""The file-descriptor limit a daemon serves under.

Every client connection is a file descriptor. Under systemd the units set ``LimitNOFILE=65536``; a
daemon started any other way (``hydractl up``, a shell) inherits the soft limit of its parent,
often 1,024, while the hard limit allows far more, and idle connections past the soft limit once
took a daemon offline. So each daemon raises its soft limit to the hard one at start (as the Go
runtime does for every program), never past :data:`MOST`, and logs what it serves under. What a
daemon does when the limit is reached anyway is each listener's own (``EMFILE`` on accept): it
keeps serving (``hydrad/engine/rpc/server.py``; uvloop sheds such connections itself).
"""

from __future__ import annotations

import logging
import resource

from hydrad.common.logs import log_event

MOST = 1 << 20
LOW = 4096  # below this, a warning: a few thousand idle connections would exhaust it


def raise_soft_limit(log: logging.Logger) -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (at most MOST); the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MOST if hard == resource.RLIM_INFINITY else min(hard, MOST)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log_event(log, logging.WARNING, "cannot raise the file descriptor limit", soft=soft, hard=hard, error=str(exc))
    if soft < LOW:
        log_event(log, logging.WARNING, "the file descriptor limit is low: each client connection takes one",
                  fd_limit=soft, hint="LimitNOFILE= in the unit, or ulimit -Hn")
    return soft

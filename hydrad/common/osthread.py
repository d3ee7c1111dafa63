"""The operating system's name for a thread, so that ``top -H``, ``ps -L``, ``/proc/PID/task/*/comm`` and
a sampler of blocked threads (scripts/bench_reload.py ``--blocked``) can tell the engine's threads apart;
Python sets only its own ``Thread.name``."""

from __future__ import annotations

import ctypes
import threading

_PR_SET_NAME = 15
_COMM_LEN = 15  # the kernel keeps 16 bytes, the last a NUL


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its Python name), cut to 15 bytes, as its OS name.
    False where the platform has no ``prctl`` (the name is a convenience: nothing depends on it)."""
    raw = (name or threading.current_thread().name).encode("utf-8", "replace")[:_COMM_LEN]
    try:
        libc = ctypes.CDLL(None)
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False

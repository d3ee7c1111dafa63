"""What a daemon costs the machine, read from /proc: resident memory, threads, open file descriptors.

The reliability program samples these while it floods a daemon, because a flood that does not crash
a daemon can still leak (fds never closed, threads never joined) or swell its memory; the peak and
the value after the flood say which."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Usage:
    rss_mb: float
    threads: int
    fds: int


def usage(pid: int) -> Usage | None:
    """One reading of ``pid``, or None when it is gone."""
    try:
        rss_kb = threads = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return Usage(round(rss_kb / 1024, 1), threads, fds)


@dataclass
class Peaks:
    """The largest reading of each figure over a sampling run, per daemon."""
    before: dict[str, Usage] = field(default_factory=dict)
    peak: dict[str, Usage] = field(default_factory=dict)
    after: dict[str, Usage] = field(default_factory=dict)

    def as_dict(self) -> dict[str, dict[str, dict[str, float]]]:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name in self.peak:
            out[name] = {k: vars(v) for k, v in (("before", self.before.get(name)), ("peak", self.peak[name]),
                                                  ("after", self.after.get(name))) if v is not None}
        return out


class Sampler:
    """Reads every daemon's usage every ``interval`` seconds on a thread until stopped.

    ``pids`` is a callable so that a daemon restarted during the run is followed under its name."""

    def __init__(self, pids: Callable[[], dict[str, int]], interval: float = 0.2) -> None:
        self.pids = pids
        self.interval = interval
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> dict[str, Usage]:
        out = {}
        for name, pid in self.pids().items():
            u = usage(pid)
            if u is not None:
                out[name] = u
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, u in self._read().items():
                p = self.peaks.peak.get(name)
                self.peaks.peak[name] = u if p is None else Usage(max(p.rss_mb, u.rss_mb), max(p.threads, u.threads),
                                                                  max(p.fds, u.fds))
            self._stop.wait(self.interval)

    def __enter__(self) -> "Sampler":
        self.peaks.before = self._read()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def settle(self, seconds: float) -> None:
        """The reading ``seconds`` after the flood ended: what the daemon kept."""
        time.sleep(seconds)
        self.peaks.after = self._read()

"""How many CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota.

"Every core", the default of the engine's thread pools, must mean every core the service may run
on, not every core the machine has. Under systemd, ``CPUAffinity=`` and ``AllowedCPUs=`` narrow the
affinity mask, and ``CPUQuota=`` (or a container's CPU limit) sets a bandwidth quota; ``os.cpu_count()``
sees neither. llama.cpp's thread pool meets at a barrier after every operation of a graph, so a pool
wider than what the kernel will run at once waits, at every step, for threads it has descheduled, or,
past a quota, throttled until the next period (100 ms by default): one late thread holds up the step.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CpuLimits:
    """What bounds this process's CPUs, read once: its affinity mask and its cgroups' tightest quota."""

    affinity: int = field(default_factory=lambda: affinity_cpus())
    quota: float | None = field(default_factory=lambda: quota_cpus())

    @property
    def usable(self) -> int:
        """The CPUs it may run on at once: the mask, capped by the quota. At least 1."""
        n = self.affinity if self.quota is None else min(self.affinity, math.floor(self.quota))
        return max(1, n)


def usable_cpus() -> int:
    """The CPUs this process may run on at once: its affinity mask, capped by the CPU quota of its
    cgroup and of every cgroup above it. At least 1."""
    return CpuLimits().usable


def affinity_cpus() -> int:
    """The CPUs in this process's affinity mask (where there is none to read: every CPU)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def quota_cpus(proc: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota of the cgroups this process is in, in CPUs (``2.5`` for 250 %), or None
    when none sets one (or none can be read). Both cgroup versions: v2's ``cpu.max`` and v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, of the cgroup and each one above it."""
    found: list[float] = []
    for directory, top, v2 in _cpu_cgroup_dirs(proc):
        d = directory
        while True:
            q = read_quota(d, v2)
            if q is not None:
                found.append(q)
            if d == top or d == d.parent:
                break
            d = d.parent
    return min(found) if found else None


def read_quota(directory: Path, v2: bool) -> float | None:
    """One cgroup directory's CPU quota in CPUs; None for no quota, a missing or unreadable file, or a
    value this does not understand (a quota that cannot be read must not narrow the pool)."""
    try:
        if v2:
            fields = (directory / "cpu.max").read_text().split()
            if len(fields) != 2 or fields[0] == "max":
                return None
            quota, period = int(fields[0]), int(fields[1])
        else:
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _cpu_cgroup_dirs(proc: Path) -> list[tuple[Path, Path, bool]]:
    """This process's cgroups that govern CPU time: (its directory, the hierarchy's mount point, is v2)."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    # mountinfo: id parent major:minor root mount-point options ... - fstype source super-options
    v1_mounts: list[tuple[str, str, set[str]]] = []
    v2_mounts: list[tuple[str, str]] = []
    for line in mounts:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        root, point = lf[3], _unescape(lf[4])
        if rf[0] == "cgroup2":
            v2_mounts.append((root, point))
        elif rf[0] == "cgroup":
            v1_mounts.append((root, point, set(rf[2].split(","))))
    out: list[tuple[Path, Path, bool]] = []
    for line in memberships:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and not controllers:
            out += [(d, Path(point), True) for root, point in v2_mounts if (d := _under(point, root, path)) is not None]
        elif "cpu" in controllers.split(","):
            out += [(d, Path(point), False) for root, point, opts in v1_mounts
                    if "cpu" in opts and (d := _under(point, root, path)) is not None]
    return [(d, top, v2) for d, top, v2 in out if d.is_dir()]


def _under(point: str, root: str, path: str) -> Path | None:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``point`` from its ``root`` (a container
    sees its own cgroup as the mount's root); None when the path lies outside that mount."""
    root = root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    rel = path[len(root):].lstrip("/")
    return Path(point) / rel if rel else Path(point)


def _unescape(field: str) -> str:
    """mountinfo escapes a space, tab, newline and backslash in a path as octal (``\\040``)."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")

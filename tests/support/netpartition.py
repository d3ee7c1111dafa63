"""A network partition with real interfaces: an engine in a network namespace of its own, joined to the
host by a veth pair on a private /30, which can be cut (link down: packets vanish, no connection is
reset) and healed. Nothing leaves the machine: both ends are this host's.

SIGSTOP freezes a process; a partition leaves it running and talking to no one, which is what a pulled
cable or a dead switch port does to an engine on another host. Needs root (``ip netns``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Sequence


class PartitionUnavailable(RuntimeError):
    """This machine cannot make a network namespace (not root, no ``ip``, no netns support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


class NetLink:
    """Namespace ``hydra-<pid>-<n>`` with ``10.213.<n>.2`` inside and ``10.213.<n>.1`` on the host."""

    def __init__(self, n: int = 1) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise PartitionUnavailable("a network namespace needs root and the ip command (iproute2)")
        self.ns = f"hydra-{os.getpid()}-{n}"
        self.host_if, self.ns_if = f"hyh{os.getpid() % 100000}{n}", f"hyn{os.getpid() % 100000}{n}"
        self.host_addr, self.ns_addr = f"10.213.{n}.1", f"10.213.{n}.2"
        self.subnet = f"10.213.{n}.0/30"
        try:
            _ip("netns", "add", self.ns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.ns)
            _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            self._in_ns("ip", "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if)
            self._in_ns("ip", "link", "set", self.ns_if, "up")
            self._in_ns("ip", "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, OSError) as exc:
            self.close()
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            raise PartitionUnavailable(f"could not make a network namespace: {detail}") from None

    def _in_ns(self, *argv: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True, timeout=10, check=True)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def heal(self, timeout: float = 5.0) -> None:
        """Link up, and back only once both ends carry traffic: the kernel moves a veth to operational
        UP (and gives it a working queue) from its link-watch work, which it defers by up to a second,
        so a stopwatch started at ``ip link set up`` would count the kernel's delay as the engine's."""
        _ip("link", "set", self.host_if, "up")
        deadline = time.monotonic() + timeout
        while not (self._up(["ip", "-o", "link", "show", "dev", self.host_if])
                   and self._up(["ip", "netns", "exec", self.ns, "ip", "-o", "link", "show", "dev", self.ns_if])):
            if time.monotonic() > deadline:
                raise PartitionUnavailable(f"the link {self.host_if} did not come up within {timeout:.0f} s")
            time.sleep(0.01)

    @staticmethod
    def _up(argv: list[str]) -> bool:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        return " state UP " in out

    def close(self) -> None:
        """Deleting the namespace deletes its end of the pair, and with it the host's end."""
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.ns, check=False)

"""A network partition with real interfaces: an engine in a network namespace of its own, joined to the
host by a veth pair on a private /30, which can be cut (link down: packets vanish, no connection is
reset) and healed (:class:`NetLink`); and a multi-host test bed (:class:`Bed`): the coordinator and the
engines each in a namespace of its own, on one bridge, every link with its own delay and jitter (``tc
netem``, else a userspace TCP relay), any of them cut and healed by script. Nothing leaves the machine:
every end is this host's.

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


class Relay:
    """A :mod:`tests.support.tcprelay` process in a node's namespace: 127.0.0.1:``port`` there reaches
    ``target`` with the link's delay and jitter added each way."""

    def __init__(self, ns: str, port: int, target: tuple[str, int], delay_ms: float, jitter_ms: float,
                 seed: int) -> None:
        import sys
        from tests.support.engine import REPO

        self.port = port
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.support.tcprelay", str(port), target[0],
             str(target[1]), f"--delay-ms={delay_ms}", f"--jitter-ms={jitter_ms}", f"--seed={seed}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(REPO),
            env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode(errors="replace").strip()  # bounded: the relay exits or says ready
        if line != "ready":
            self.close()
            raise PartitionUnavailable(f"the TCP relay did not start: {line!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Node:
    """One host of the bed: a namespace, its address on the bed's bridge, and how to cut its link."""

    def __init__(self, bed: "Bed", name: str, ns: str, addr: str, port_if: str) -> None:
        self.bed = bed
        self.name = name
        self.ns = ns
        self.ns_addr = addr
        self.port_if = port_if  # its end on the bridge (in the switch namespace): what a cut takes down
        self.subnet = bed.subnet
        self.host_addr = bed.host_addr  # the test's own end (the clients' host)
        self.relays: list[Relay] = []

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut(self) -> None:
        self.bed.sw("ip", "link", "set", self.port_if, "down")

    def heal(self, timeout: float = 5.0) -> None:
        """Link up, and back only once the bridge forwards on it again (see :meth:`NetLink.heal`)."""
        self.bed.sw("ip", "link", "set", self.port_if, "up")
        deadline = time.monotonic() + timeout
        while " state UP " not in self.bed.sw("ip", "-o", "link", "show", "dev", self.port_if).stdout \
                or "forwarding" not in self.bed.sw("bridge", "link", "show", "dev", self.port_if).stdout:
            if time.monotonic() > deadline:
                raise PartitionUnavailable(f"{self.name}'s link did not come back within {timeout:.0f} s")
            time.sleep(0.01)

    def reach(self, target: tuple[str, int], port: int) -> tuple[str, int]:
        """The address this node's processes use for ``target``: ``target`` itself where netem shapes the
        link, else a relay in this namespace that adds the link's delay and jitter."""
        if self.bed.netem or (self.bed.delay_ms == 0 and self.bed.jitter_ms == 0):
            return target
        relay = Relay(self.ns, port, target, self.bed.delay_ms, self.bed.jitter_ms, seed=len(self.relays) + 1)
        self.relays.append(relay)
        return ("127.0.0.1", port)


class Bed:
    """Hosts on one switch, all on this machine: every node a network namespace with one veth link into a
    bridge that lives in a namespace of its own (the host's network is not touched), and this process's
    namespace on the bridge as well (``host_addr``, where the tests' clients are). Addresses are
    ``10.215.<n>.<i>/24``; nothing is routed anywhere else.

    Each node's link gets ``delay_ms`` ± ``jitter_ms`` (and ``loss_pct``) by ``tc netem`` on its interface
    when the kernel has sch_netem (``shaping == "netem"``); without it (``"relay"``), traffic a node starts
    towards another goes through a userspace TCP relay in its namespace that adds the delay and jitter each
    way (:meth:`Node.reach`; loss cannot be added). ``cut``/``heal`` take a node's bridge port down/up:
    packets vanish, no connection is reset, as behind a pulled cable."""

    def __init__(self, nodes: Sequence[str], n: int = 1, delay_ms: float = 0.0, jitter_ms: float = 0.0,
                 loss_pct: float = 0.0) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("bridge") is None:
            raise PartitionUnavailable("the test bed needs root and iproute2 (ip, bridge)")
        tag = f"{os.getpid() % 100000}{n}"
        self.sw_ns = f"hydra-{os.getpid()}-bed{n}"
        self.subnet = f"10.215.{n}.0/24"
        self.host_addr = f"10.215.{n}.254"
        self.host_if = f"hbh{tag}"
        self.delay_ms, self.jitter_ms, self.loss_pct = delay_ms, jitter_ms, loss_pct
        self.nodes: dict[str, Node] = {}
        self.netem = False
        self.shaping = "none"
        self._made: list[str] = []
        try:
            _ip("netns", "add", self.sw_ns)
            self._made.append(self.sw_ns)
            self.sw("ip", "link", "add", "br0", "type", "bridge", "forward_delay", "0")
            self.sw("ip", "link", "set", "br0", "up")
            self.sw("ip", "link", "set", "lo", "up")
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", "hb-port")
            _ip("link", "set", "hb-port", "netns", self.sw_ns)
            self.sw("ip", "link", "set", "hb-port", "master", "br0")
            self.sw("ip", "link", "set", "hb-port", "up")
            _ip("addr", "add", f"{self.host_addr}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            for i, name in enumerate(nodes, start=1):
                self._add(name, i, tag)
            if delay_ms or jitter_ms or loss_pct:
                self._shape()
        except (subprocess.CalledProcessError, OSError) as exc:
            self.close()
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            raise PartitionUnavailable(f"could not build the test bed: {detail}") from None

    def sw(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command in the switch's namespace."""
        return subprocess.run(["ip", "netns", "exec", self.sw_ns, *argv], capture_output=True, text=True,
                              timeout=10, check=check)

    def _add(self, name: str, i: int, tag: str) -> None:
        ns = f"hydra-{os.getpid()}-{name}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        port_if, node_if = f"p{i}", f"hb{tag}n{i}"
        _ip("link", "add", node_if, "type", "veth", "peer", "name", f"hbp{tag}{i}")
        _ip("link", "set", f"hbp{tag}{i}", "netns", self.sw_ns)
        self.sw("ip", "link", "set", f"hbp{tag}{i}", "name", port_if)
        self.sw("ip", "link", "set", port_if, "master", "br0")
        self.sw("ip", "link", "set", port_if, "up")
        _ip("link", "set", node_if, "netns", ns)
        addr = f"10.215.{self.subnet.split('.')[2]}.{i}"
        for argv in (["ip", "link", "set", node_if, "name", "eth0"], ["ip", "addr", "add", f"{addr}/24", "dev", "eth0"],
                     ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=10, check=True)
        node = self.nodes[name] = Node(self, name, ns, addr, port_if)
        node.heal()

    def _shape(self) -> None:
        """netem on every node's interface, or the relay where the kernel lacks it (the first refusal says)."""
        spec = ["delay", f"{self.delay_ms}ms", f"{self.jitter_ms}ms"] + (["loss", f"{self.loss_pct}%"] if self.loss_pct else [])
        for node in self.nodes.values():
            p = subprocess.run(["ip", "netns", "exec", node.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                                *spec], capture_output=True, text=True, timeout=10)
            if p.returncode != 0:
                self.netem, self.shaping = False, "relay"
                self.netem_error = p.stderr.strip()
                return
        self.netem, self.shaping = True, "netem"

    def close(self) -> None:
        for node in self.nodes.values():
            for relay in node.relays:
                relay.close()
        _ip("link", "del", self.host_if, check=False)
        for ns in reversed(self._made):  # deleting a namespace deletes the veth ends in it, and their peers
            _ip("netns", "del", ns, check=False)

"""Each daemon listens on the documented sockets and nothing else.

The listening sockets are read from the kernel (the process's file descriptors matched against
``/proc/<pid>/net/{tcp,tcp6,udp,udp6}``), not from the daemon's own account: a door the code opened
by accident (a library's debug server, a second RPC listener) would show up here. The documented
doors (docs/reliability.md): an engine has its HTTP API and its merged RPC port; the coordinator its
HTTP front door, the bus ROUTER, the events PUB and the request stream (on by default; with it off,
one door fewer). All on the configured address (loopback by default)."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model


def _address(hex_addr: str) -> tuple[str, int]:
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:  # four little-endian 32-bit words
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0])
                                                        for i in range(0, 16, 4)))
    return ip, int(port_hex, 16)


def listening(pid: int) -> set[tuple[str, str, int]]:
    """(protocol, address, port) of every TCP socket the process listens on and every UDP socket it bound."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if inode in inodes and (state == "0A" if table.startswith("tcp") else True):
                out.add((table.rstrip("6"), *_address(local)))
    return out


def test_engine_and_coordinator_listen_only_on_their_documented_doors(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    c = Coordinator(tmp_path, heartbeat_interval_s=0.5)
    try:
        c.wait_ready()
        e = start_engine(name="doors", defaults={"model": "smollm2-135m"},
                         extra={"bus": c.engine_bus(heartbeat_interval_s=0.5)})
        e.wait_ready()
        c.wait_engines(lambda es: "doors" in es and es["doors"]["alive"], 30, what="the engine registered")
        rpc_port = int(yaml.safe_load(e.config.read_text())["rpc"]["port"])
        assert listening(e.proc.pid) == {("tcp", "127.0.0.1", e.port), ("tcp", "127.0.0.1", rpc_port)}
        bus_port = int(c.bus.rsplit(":", 1)[1])
        events_port = int(c.events_endpoint.rsplit(":", 1)[1])
        stream_port = int((c.request_stream or "").rsplit(":", 1)[1])
        assert listening(c.proc.pid) == {("tcp", "127.0.0.1", c.port), ("tcp", "127.0.0.1", bus_port),
                                         ("tcp", "127.0.0.1", events_port), ("tcp", "127.0.0.1", stream_port)}
        # the engine's merged port is opened by the engine itself, not by a child process
        children = Path(f"/proc/{e.proc.pid}/task/{e.proc.pid}/children").read_text().split()
        assert children == []
    finally:
        c.stop()


def test_a_coordinator_without_the_request_stream_has_one_door_fewer(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, heartbeat_interval_s=0.5, request_stream=False)
    try:
        c.wait_ready()
        bus_port = int(c.bus.rsplit(":", 1)[1])
        events_port = int(c.events_endpoint.rsplit(":", 1)[1])
        assert listening(c.proc.pid) == {("tcp", "127.0.0.1", c.port), ("tcp", "127.0.0.1", bus_port),
                                         ("tcp", "127.0.0.1", events_port)}
    finally:
        c.stop()

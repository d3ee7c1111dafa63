"""Who may call a control surface: one address check for every allow-list of both daemons
(``control_allow_from`` on engines, ``admin_allow_from`` on the coordinator)."""

from __future__ import annotations

import ipaddress


def address_allowed(host: str | None, networks: list[str]) -> bool:
    """Whether a peer address lies in one of ``networks`` (CIDR). IPv4 clients of a dual-stack
    listener arrive as ``::ffff:a.b.c.d`` and count as the IPv4 address; anything unparsable
    (or no address at all, e.g. a Unix socket) is refused."""
    if host is None:
        return False
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in ipaddress.ip_network(n, strict=False) for n in networks)


def check_networks(networks: list[str]) -> list[str]:
    """An allow-list as a settings validator takes it: every entry a CIDR (ValueError otherwise)."""
    for item in networks:
        ipaddress.ip_network(item, strict=False)
    return networks


def split_endpoint(endpoint: str, *, allow_zero: bool = False) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) → (host, port); ValueError says what is wrong. Port 0 (a free
    one) only where a listener binds (``allow_zero``): an endpoint to connect to needs a port."""
    host, sep, port = endpoint.rpartition(":")
    low = 0 if allow_zero else 1
    if (not sep or not host or not port.isdigit() or not low <= int(port) < 65536
            or any(c.isspace() for c in endpoint)):
        raise ValueError(f"{endpoint!r} is not host:port with a port of {low}-65535")
    return host.strip("[]"), int(port)


def split_socket_endpoint(endpoint: str) -> tuple[str, int]:
    """A ZeroMQ endpoint, ``tcp://host:port`` (``*`` for every address, port 0 for a free one), → (host,
    port); ValueError for one that is not (an ``ipc://`` path)."""
    _scheme, sep, rest = endpoint.partition("://")
    return split_endpoint(rest if sep else endpoint, allow_zero=True)

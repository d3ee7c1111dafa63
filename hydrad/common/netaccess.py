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


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) → (host, port); ValueError says what is wrong."""
    host, sep, port = endpoint.rpartition(":")
    if (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536
            or any(c.isspace() for c in endpoint)):
        raise ValueError(f"{endpoint!r} is not host:port")
    return host.strip("[]"), int(port)

"""Which network interface owns an address, so that UCX listens there and nowhere else.

NIXL moves KV over UCX, whose TCP transport opens listening sockets on every network device
it may use (``UCX_NET_DEVICES``, default all of them), whatever ``--kv-host`` says. Naming
the one device that owns the kv-host address keeps those listeners off the others.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

# UCX transports that are not TCP yet use network devices (InfiniBand/RoCE verbs, "all").
_OTHER_NET_TRANSPORTS = ("rc", "ud", "dc", "ib", "all")


class NotAnInterfaceAddress(ValueError):
    """The host names no address of this machine's interfaces."""


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone (%eth0)
    except ValueError:
        return None


def interface_of(host: str) -> str:
    """The interface whose address ``host`` is (an IP, or a name resolved to one).

    Raises :class:`NotAnInterfaceAddress` for a wildcard (0.0.0.0, ::), which names every
    interface and which the other pool could not connect to, and for an address no
    interface holds."""
    try:
        resolved = {_ip(str(info[4][0])) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise NotAnInterfaceAddress(f"{host!r} does not resolve: {exc}") from exc
    wanted = {ip for ip in resolved if ip is not None}
    if any(ip.is_unspecified for ip in wanted):
        raise NotAnInterfaceAddress(f"{host!r} is a wildcard: name one interface's address")
    for name, addresses in sorted(psutil.net_if_addrs().items()):
        if any(_ip(a.address) in wanted for a in addresses):
            return str(name)
    raise NotAnInterfaceAddress(f"no interface of this host has address {host!r}")


def tcp_only(ucx_tls: str | None) -> bool:
    """Whether a ``UCX_TLS`` value leaves TCP as UCX's only network transport. Unset (UCX
    picks everything, InfiniBand included) and exclusion lists (``^...``) do not."""
    if not ucx_tls or ucx_tls.startswith("^"):
        return False
    names = [n.strip().lower() for n in ucx_tls.split(",")]
    return not any(n.startswith(_OTHER_NET_TRANSPORTS) for n in names)

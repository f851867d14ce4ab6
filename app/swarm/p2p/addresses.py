"""The addresses this machine can be dialled at, as text: no libp2p here.

`swarmling id` prints them without starting a host, so this module must stay free of py-libp2p
(importing it costs about a second and 70 MB).
"""

from __future__ import annotations

import ipaddress
import socket

import psutil


# RFC 2544 benchmarking addresses: never routed on the internet, so only labs use them (tests/netlab.py's
# simulated internet does): treated as public.
BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")


def routable(ip: str) -> bool:
    """An address peers elsewhere on the internet can reach: global, or in 198.18.0.0/15."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return address.is_global or address in BENCHMARK_NET


def interface_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The networks this machine's interfaces are on (address and netmask)."""
    nets = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6) and a.netmask:
                try:
                    nets.append(ipaddress.ip_network(f"{a.address.split('%')[0]}/{a.netmask}", strict=False))
                except ValueError:
                    continue
    return nets


def within_reach(addr: str, networks=None) -> bool:
    """Could a dial from this machine reach `addr` at all? A public address, this machine's own
    (loopback) or one on a network we are on: yes. Another home's LAN address (what a node behind NAT
    announces before a helper gave it a slot) is never reachable from here, so dialling it only
    waits for a timeout. Names (/dns…) and anything unparsable: maybe, so yes."""
    host = _host_of(addr)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return True
    if ip.is_loopback or routable(host):
        return True
    return any(ip in net for net in (interface_networks() if networks is None else networks))


def interface_hosts() -> list[str]:
    """This machine's IPv4 addresses, LAN ones first (what a wildcard listener can be dialled at)."""
    hosts = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    return sorted(hosts, key=lambda h: (h.startswith("127."), h)) or ["127.0.0.1"]


def _host_of(addr: str) -> str:
    parts = addr.split("/")
    return parts[2] if len(parts) > 2 and parts[1] in ("ip4", "ip6") else ""


def is_unspecified(addr: str) -> bool:
    """A wildcard listen address (0.0.0.0, ::): dialling it reaches the dialler's own machine."""
    return _host_of(addr) in ("0.0.0.0", "::")


def is_loopback(addr: str) -> bool:
    """127.x or ::1: this machine, whoever dials it."""
    host = _host_of(addr)
    return host.startswith("127.") or host == "::1"


def dialable_addrs(addrs: list[str], peer_id: str) -> list[str]:
    """Listen addresses as other machines can dial them: /0.0.0.0/ expanded to each interface,
    loopback left out unless there is nothing else (a node listening on 127.0.0.1 only), never a
    wildcard; /p2p/<id> appended when given.

    Peers dial the first address they know, and every node listens on the same default port: a
    wildcard or loopback address handed to a peer on another machine makes it dial itself.
    """
    out = []
    for addr in addrs:
        addr = addr.split("/p2p/")[0]
        if addr.startswith("/ip4/0.0.0.0/"):
            rest = addr[len("/ip4/0.0.0.0") :]
            out += [f"/ip4/{h}{rest}" for h in interface_hosts()]
        elif not is_unspecified(addr):
            out.append(addr)
    remote = [a for a in out if not is_loopback(a)]
    suffix = f"/p2p/{peer_id}" if peer_id else ""
    return [f"{a}{suffix}" for a in dict.fromkeys(remote or out)]


def host_addr(host: str, port: int, peer_id: str) -> str:
    """A peer address for an IP or a DNS name."""
    try:
        ip = ipaddress.ip_address(host)
        proto = "ip4" if ip.version == 4 else "ip6"
    except ValueError:
        proto = "dns"
    return f"/{proto}/{host}/tcp/{port}/p2p/{peer_id}"

"""Peer addresses named by DNS (/dns, /dns4, /dns6), resolved by the system's resolver before a dial.

py-libp2p 0.8.1's TCP transport resolves /dns* itself with dnspython, which asks the nameservers
in resolv.conf and never reads /etc/hosts (so `/dns4/localhost/…` and names from a VPN's or the
LAN's own resolver fail), and when that answers nothing it dials the unresolved address, which
fails too: measured, a node given `/dns4/localhost/tcp/<port>/p2p/<id>` never connected. Here the
name goes through getaddrinfo (the hosts file, the system's resolvers, as any program would) at
every dial, so a helper that moves to a new IP is found at its name; the dialler then dials the
/ip4 and /ip6 addresses, which py-libp2p handles.
"""

from __future__ import annotations

import socket

import trio

DNS_FAMILIES = {"dns": socket.AF_UNSPEC, "dns4": socket.AF_INET, "dns6": socket.AF_INET6}
MAX_RESOLVED = 4  # addresses of one name worth a dial each (IPv4 first)


def is_dns(addr: str) -> bool:
    """`/dns…/<name>/…`: an address that names its host instead of giving its IP."""
    return addr.split("/")[1:2] in (["dns"], ["dns4"], ["dns6"])


async def resolve(addr: str) -> list[str]:
    """`/dns4/helper.example.org/tcp/38433/p2p/<id>` → `['/ip4/203.0.113.7/tcp/38433/p2p/<id>', …]`.

    An address that is not a DNS one comes back as it is. OSError (socket.gaierror) when the name
    does not resolve; no address is returned twice, at most MAX_RESOLVED, IPv4 ones first."""
    parts = addr.split("/")
    if not is_dns(addr) or len(parts) < 4:
        return [addr]
    name, rest = parts[2], "/".join(parts[3:])
    infos = await trio.socket.getaddrinfo(name, None, family=DNS_FAMILIES[parts[1]], type=socket.SOCK_STREAM)
    out = []
    for family, *_, sockaddr in sorted(infos, key=lambda info: info[0] != socket.AF_INET):
        if family == socket.AF_INET:
            out.append(f"/ip4/{sockaddr[0]}/{rest}")
        elif family == socket.AF_INET6:
            out.append(f"/ip6/{sockaddr[0].split('%')[0]}/{rest}")
    if not out:
        raise socket.gaierror(f"{name} has no IPv4 or IPv6 address")
    return list(dict.fromkeys(out))[:MAX_RESOLVED]

"""The addresses this machine can be dialled at, as text: no libp2p here.

`swarmling id` prints them without starting a host, so this module must stay free of py-libp2p
(importing it costs about a second and 70 MB).
"""

from __future__ import annotations

import socket

import psutil


def interface_hosts() -> list[str]:
    """This machine's IPv4 addresses, LAN ones first (what a wildcard listener can be dialled at)."""
    hosts = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    return sorted(hosts, key=lambda h: (h.startswith("127."), h)) or ["127.0.0.1"]


def dialable_addrs(addrs: list[str], peer_id: str) -> list[str]:
    """Listen addresses as peers can dial them: /0.0.0.0/ expanded to each interface, /p2p/<id> appended."""
    out = []
    for addr in addrs:
        addr = addr.split("/p2p/")[0]
        if addr.startswith("/ip4/0.0.0.0/"):
            rest = addr[len("/ip4/0.0.0.0") :]
            out += [f"/ip4/{h}{rest}" for h in interface_hosts()]
        else:
            out.append(addr)
    return [f"{a}/p2p/{peer_id}" for a in dict.fromkeys(out)]

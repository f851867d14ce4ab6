"""Whom the node dials, and how often it tries again.

Dial targets are the peers the user named (bootstrap and static: often just starting up too, so
retried at least every NAMED_BACKOFF_MAX_S), the peers remembered from earlier runs, and those
discovered on the LAN by mDNS (maybe gone for good: they back off to BACKOFF_MAX_S). Nobody else
is dialled: py-libp2p's own auto-connector is off (see host.py), so connections stay bounded
whatever the swarm's size.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import multiaddr
import trio
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

log = logging.getLogger("swarmling.swarm")

DIAL_TIMEOUT_S = 10.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 2.0, 300.0
NAMED_BACKOFF_MAX_S = 15.0
MAX_DIAL_TARGETS = 256  # discovered peers beyond this are not dialled
LOOP_INTERVAL_S = 1.0


def parse_peer_addr(text: str) -> PeerInfo:
    """A dialable /ip4|ip6|dns…/tcp/<port>/p2p/<peer id> address, or ValueError saying why not."""
    try:
        info = info_from_p2p_addr(multiaddr.Multiaddr(text))
    except Exception as exc:  # noqa: BLE001 — multiaddr raises several unrelated types
        raise ValueError(f"{text!r} is not a peer address like /ip4/192.0.2.1/tcp/38433/p2p/12D3Koo…: {exc}") from None
    return info


class Dialer:
    """Keeps the dial targets connected, with exponential backoff and jitter per peer.

    `add_targets` runs before the loop starts; `discovered`, `connected_peers` and
    `connected_addrs` from any thread; `run` and `is_target` on trio's.
    """

    def __init__(self, own_peer_id: str) -> None:
        self._own = own_peer_id
        self._lock = threading.Lock()
        self._connected: set[str] = set()
        self._targets: dict[str, PeerInfo] = {}  # peer id -> addresses we may dial
        self._backoff: dict[str, tuple[float, float]] = {}  # peer id -> (next try, delay)
        self._named: set[str] = set()  # targets the user named
        self._discovered: list[PeerInfo] = []  # from mDNS, on zeroconf's thread
        self._dialled: dict[str, str] = {}  # peer id -> an address that worked, worth remembering

    def add_targets(self, addrs: tuple[str, ...], named: int) -> None:
        """Peer addresses to keep connected, the first `named` of them the user's; ValueError on a bad one."""
        for i, text in enumerate(addrs):
            info = parse_peer_addr(text)
            self._targets[info.peer_id.to_base58()] = info
            if i < named:
                self._named.add(info.peer_id.to_base58())

    def discovered(self, info: PeerInfo) -> None:
        """A peer found at run time; dialled from the loop's next pass."""
        with self._lock:
            self._discovered.append(info)

    def is_target(self, peer: str) -> bool:
        return peer in self._targets

    def connected_peers(self) -> list[str]:
        with self._lock:
            return sorted(self._connected)

    def connected_addrs(self) -> list[str]:
        """Dialable addresses of connected peers that we reached by dialling."""
        with self._lock:
            return [addr for pid, addr in self._dialled.items() if pid in self._connected]

    async def run(self, host) -> None:
        """Dial every target not connected whose backoff has passed, once a second, forever."""
        while True:
            self._take_discovered()
            self._refresh_connected(host)
            now = time.monotonic()
            for pid, info in list(self._targets.items()):
                if pid in self._connected or pid == self._own:
                    self._backoff.pop(pid, None)
                    continue
                next_try, delay = self._backoff.get(pid, (0.0, BACKOFF_FIRST_S))
                if now < next_try:
                    continue
                if await self._dial(host, pid, info):
                    self._backoff.pop(pid, None)
                    self._remember(info)
                else:
                    jitter = random.uniform(0.8, 1.2)
                    cap = NAMED_BACKOFF_MAX_S if pid in self._named else BACKOFF_MAX_S
                    self._backoff[pid] = (time.monotonic() + delay * jitter, min(cap, delay * 2))
            self._refresh_connected(host)
            await trio.sleep(LOOP_INTERVAL_S)

    def _take_discovered(self) -> None:
        with self._lock:
            discovered, self._discovered = self._discovered, []
        for info in discovered:
            pid = info.peer_id.to_base58()
            if pid != self._own and len(self._targets) < MAX_DIAL_TARGETS:
                self._targets.setdefault(pid, info)

    def _refresh_connected(self, host) -> None:
        connected = {p.to_base58() for p in host.get_connected_peers()}
        with self._lock:
            self._connected = connected

    @staticmethod
    async def _dial(host, pid: str, info: PeerInfo) -> bool:
        with trio.move_on_after(DIAL_TIMEOUT_S):
            try:
                await host.connect(info)
                return True
            except Exception as exc:  # noqa: BLE001 — unreachable peers are normal
                log.debug("dial %s failed: %s", pid[:16], exc)
        return False

    def _remember(self, info: PeerInfo) -> None:
        if info.addrs:
            pid = info.peer_id.to_base58()
            with self._lock:
                self._dialled[pid] = f"{info.addrs[0]}/p2p/{pid}"
                self._connected.add(pid)

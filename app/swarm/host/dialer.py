"""Whom the node dials, and how often it tries again.

Dial targets are the peers the user named (bootstrap and static: often just starting up too, so
retried at least every NAMED_BACKOFF_MAX_S), the peers remembered from earlier runs, and those
discovered on the LAN by mDNS (maybe gone for good: they back off to BACKOFF_MAX_S). Nobody else
is dialled: py-libp2p's own auto-connector is off (see host.py), so connections stay bounded
whatever the swarm's size.

A target is always dialled at its configured address, whatever identify said since (the address
is pinned in the peerstore, peerstore.py), and a named target skips py-libp2p's 60 s "recently
failed" cache: a restarted bootstrap or helper is found again at the next try (≤ 15 s).
A target named by DNS (`/dns4/helper.example.org/…`) is resolved at each try (`resolve`: py-libp2p
0.8.1 cannot) and its IP addresses are dialled; the name is what is remembered.
Bundles' authors are dialled here too, for a fetch (`AuthorDialer`, for bundle_protocol.py): with
their own slots and deadlines, and `DialCooldown`, the same idea as a target's backoff: an author
that could not be dialled is not dialled again for a while, so it cannot keep taking fetch slots.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from collections.abc import Awaitable, Callable

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from ..nat.relay import CIRCUIT, is_circuit, relay_of
from ..p2p.addresses import interface_networks, within_reach
from .backoff import PeerBackoff
from .bundle_protocol import FetchOutcome, Outcome, with_words

log = logging.getLogger("swarmling.swarm")

DIAL_TIMEOUT_S = 5.0  # a TCP + Noise + yamux handshake takes well under a second where it works
BACKOFF_FIRST_S, BACKOFF_MAX_S = 2.0, 300.0
NAMED_BACKOFF_MAX_S = 15.0
MAX_DIAL_TARGETS = 256  # discovered peers beyond this are not dialled
LOOP_INTERVAL_S = 1.0
COOLDOWN_FIRST_S, COOLDOWN_MAX_S = 30.0, 600.0
MAX_COOLDOWNS = 1024
MAX_DIALING = 2  # dials to unconnected authors at once, apart from the fetches' transfers
MAX_DIAL_ATTEMPTS = 3  # announced addresses tried per fetch (public or relayed first, by the author)
CIRCUIT_DIAL_TIMEOUT_S = 10.0  # two hops and three parties' handshakes
DNS_FAMILIES = {"dns": socket.AF_UNSPEC, "dns4": socket.AF_INET, "dns6": socket.AF_INET6}
MAX_RESOLVED = 4  # addresses of one name worth a dial each (IPv4 first)


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
        self._retry = PeerBackoff(BACKOFF_FIRST_S, BACKOFF_MAX_S, jitter=0.2)  # targets whose dial failed
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
        for info in self._targets.values():
            if not _names_host(info):  # a name is pinned as the address it resolved to, once dialled
                pin_address(host, info)
        while True:
            self._take_discovered()
            self._refresh_connected(host)
            for pid, info in list(self._targets.items()):
                if pid in self._connected or pid == self._own:
                    self._retry.succeeded(pid)
                    continue
                if self._retry.blocked(pid):
                    continue
                if pid in self._named:
                    _forget_failures(host, info)
                dialled = await self._dial(host, pid, info)
                if dialled is not None:
                    self._retry.succeeded(pid)
                    self._remember(info)
                    pin_address(host, dialled)
                else:
                    self._retry.failed(pid, NAMED_BACKOFF_MAX_S if pid in self._named else None)
            self._refresh_connected(host)
            await trio.sleep(LOOP_INTERVAL_S)

    def forget_connections(self) -> None:
        """The host went down: nobody is connected until the next one says so."""
        with self._lock:
            self._connected = set()

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
    async def _dial(host, pid: str, info: PeerInfo) -> PeerInfo | None:
        """Connect to a target within DIAL_TIMEOUT_S; the address that worked (as a PeerInfo), or None.

        A /dns… target is resolved first and its addresses tried in turn: py-libp2p never sees the
        name (its peerstore would keep it and dial it first, and fail)."""
        with trio.move_on_after(DIAL_TIMEOUT_S):
            try:
                attempts = [info]
                if _names_host(info):
                    attempts = [PeerInfo(info.peer_id, [multiaddr.Multiaddr(a)]) for a in await resolve(str(info.addrs[0]))]
                for attempt in attempts:
                    try:
                        await host.connect(attempt)
                        return attempt
                    except Exception as exc:  # noqa: BLE001 — unreachable peers are normal
                        log.debug("dial %s at %s failed: %s", pid[:16], attempt.addrs, exc)
            except Exception as exc:  # noqa: BLE001 — a name that does not resolve (now) is retried later
                log.debug("dial %s failed: %s", pid[:16], exc)
        return None

    def _remember(self, info: PeerInfo) -> None:
        if info.addrs:
            pid = info.peer_id.to_base58()
            with self._lock:
                self._dialled[pid] = f"{info.addrs[0]}/p2p/{pid}"
                self._connected.add(pid)


def _names_host(info: PeerInfo) -> bool:
    return bool(info.addrs) and is_dns(str(info.addrs[0]))


def pin_address(host, info: PeerInfo) -> None:
    """Keep the address in `info` for its peer whatever identify says later (peerstore.py)."""
    pin = getattr(host.get_peerstore(), "pin", None)  # DialablePeerstore's
    if pin is not None and info.addrs:
        pin(info.peer_id, info.addrs[0])


def _forget_failures(host, info: PeerInfo) -> None:
    """Drop py-libp2p's "recently failed all addresses" mark (60 s) for a peer we mean to retry now."""
    cache = getattr(host.get_network(), "_negative_peer_cache", None)  # private in 0.8.1: best effort
    if cache is not None:
        cache.evict(str(info.peer_id))


class DialCooldown(PeerBackoff):
    """Peers that could not be dialled lately, each blocked for 30 s, doubling per failure to 10 min.

    Written on the network thread, read from the round loop (whom not to plan fetches from)."""

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__(COOLDOWN_FIRST_S, COOLDOWN_MAX_S, max_peers=MAX_COOLDOWNS, clock=clock)


class AuthorDialer:
    """Connects to a bundle's author for a fetch (trio side only; one per life of the host)."""

    def __init__(self, host, cooldown: DialCooldown, dial_circuit: Callable[[str], Awaitable[None]] | None = None,
                 networks: Callable[[], list] = interface_networks) -> None:
        self._host = host
        self._networks = networks  # the networks this machine is on: whose private addresses it can reach
        self._cooldown = cooldown  # authors we could not dial lately
        self._dial_circuit = dial_circuit  # connects through a helper's relay (relay.py); None on helpers
        self._limit = trio.Semaphore(MAX_DIALING)

    async def dial(self, peer: str, pid: ID, addrs: tuple[str, ...]) -> Outcome | None:
        """Connect to an author for a fetch; None once connected, else why not (and it cools down).

        The announced addresses are tried in the author's order, which puts the one peers can
        reach first (a public address a helper confirmed, else its slots on helpers' relays), at
        most MAX_DIAL_ATTEMPTS of them and each within DIAL_TIMEOUT_S. An author that announces
        relay slots is dialled only through them (its other addresses are its LAN's, whose
        peers find it by mDNS), and when none of its helpers could be reached the author is not
        to blame (NO_ROUTE: no cooldown, no mark on its record): a helper that restarts must not
        leave its nodes shunning each other for minutes afterwards. A circuit that neither opens
        nor is refused within CIRCUIT_DIAL_TIMEOUT_S says as little (three parties' handshakes, any
        of them slow): SLOW_CIRCUIT, tried again next round, not held against the author."""
        if self._cooldown.blocked(peer):
            return with_words(FetchOutcome.COOLING)
        attempts = [a for a in addrs if _peer_info_or_none(a) and _peer_info_or_none(a).peer_id == pid
                    and (not is_circuit(a) or relay_of(a))]  # a circuit must name its helper
        if self._dial_circuit is None:
            attempts = [a for a in attempts if not is_circuit(a)]
        elif any(is_circuit(a) for a in attempts):
            attempts = [a for a in attempts if is_circuit(a)]
        if not attempts:
            return FetchOutcome.FAILED, "not connected and no address announced"
        # Another home's LAN address (all a node behind NAT announces until a helper gives it a
        # slot, as while a restarted helper comes back) cannot be reached from here: not dialled,
        # and not held against the author (its next announcement names its slot).
        networks = self._networks()
        attempts = [a for a in attempts if within_reach(a.split(CIRCUIT, 1)[0], networks)]
        if not attempts:
            return with_words(FetchOutcome.NO_ROUTE)
        failure, blamed = None, False
        async with self._limit:
            for addr in attempts[:MAX_DIAL_ATTEMPTS]:
                helper_up = not is_circuit(addr) or relay_of(addr) in {p.to_base58() for p in self._host.get_connected_peers()}
                failure = await self._dial_one(addr)
                if failure is None:
                    self._cooldown.succeeded(peer)
                    return None
                blamed = blamed or (helper_up and failure[0] is not FetchOutcome.SLOW_CIRCUIT)
        if not blamed:
            return failure if failure[0] is FetchOutcome.SLOW_CIRCUIT else with_words(FetchOutcome.NO_ROUTE)
        self._cooldown.failed(peer)
        return failure

    async def _dial_one(self, addr: str) -> Outcome | None:
        with trio.move_on_after(CIRCUIT_DIAL_TIMEOUT_S if is_circuit(addr) else DIAL_TIMEOUT_S):
            try:
                if is_circuit(addr):
                    await self._dial_circuit(addr)
                else:
                    info = parse_peer_addr(addr)
                    await self._host.connect(info)
                    pin_address(self._host, info)
                return None
            except Exception as exc:  # noqa: BLE001 — unreachable authors are normal
                return FetchOutcome.FAILED, f"dial failed: {type(exc).__name__}: {exc}"[:200]
        if is_circuit(addr):
            return with_words(FetchOutcome.SLOW_CIRCUIT)
        return FetchOutcome.FAILED, f"dial timed out after {DIAL_TIMEOUT_S:.0f} s"


def _peer_info_or_none(text: str) -> PeerInfo | None:
    try:
        return parse_peer_addr(text)
    except ValueError:
        return None


# ---- peer addresses named by DNS (/dns, /dns4, /dns6), resolved by the system's resolver ---------------
#
# py-libp2p 0.8.1's TCP transport resolves /dns* itself with dnspython, which asks the nameservers
# in resolv.conf and never reads /etc/hosts (so `/dns4/localhost/…` and names from a VPN's or the
# LAN's own resolver fail), and when that answers nothing it dials the unresolved address, which
# fails too: measured, a node given `/dns4/localhost/tcp/<port>/p2p/<id>` never connected. Here the
# name goes through getaddrinfo (the hosts file, the system's resolvers, as any program would) at
# every dial, so a helper that moves to a new IP is found at its name; the dialler then dials the
# /ip4 and /ip6 addresses, which py-libp2p handles.


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

"""Circuit relay v2: helpers relay bundles for nodes behind NAT; those nodes hold a slot on them.

A node behind a home router cannot be dialled, so peers could never fetch its rollouts. A public
helper (`swarmling relay`) runs the relay's hop side; a node that finds itself unreachable
(reachability.py) reserves a slot on helpers it is connected to and announces
`<helper address>/p2p-circuit/p2p/<itself>`, which any peer can dial: the helper opens a stream
to the node over the connection the node opened, and copies bytes both ways. Bundles are
kilobytes of text, so relaying them is cheap; everything on a relayed connection is still Noise
end to end (the helper sees ciphertext) and still goes through the node's own checks.

py-libp2p 0.8.1, measured in the namespace lab (tests/netlab.py), and what is done here:
- a reservation is made by hand (a hop stream and `_make_reservation`: its own refresher and
  discovery are not used): `reachability.keep_reachable` renews it every RESERVE_EVERY_S, which
  also covers a helper that restarted and forgot us (re-reserving an unexpired slot is a no-op);
- a /p2p-circuit address must be dialled through the circuit transport (`dial_circuit`), never
  `host.connect`, which only knows TCP;
- per-circuit duration and bytes, circuits per reserved node and reservations in all are bounded
  by `RelayLimits`; a peer's reservation count per IP is not (one peer ID = one slot, and a slot
  costs the helper a few hundred bytes);
- the hop counts nothing: `CountingRelay` counts what it copies, for `swarmling relay`'s figures
  and the lab test.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from ..p2p.streams import remote_ip

log = logging.getLogger("swarmling.swarm")

# What one helper gives: a bundle is ≤ 512 KiB and crosses in seconds, so a circuit lasts two
# minutes and carries 4 MiB at most; a reserved node takes 8 circuits at once; 256 nodes hold a
# slot (a slot is a few hundred bytes of state; the bytes are what costs, and those are bounded
# per circuit). A reservation lasts an hour and is renewed well before.
HELPER_LIMITS = RelayLimits(duration=120, data=4 << 20, max_circuit_conns=8, max_reservations=256,
                            reservation_ttl=3600)
NODE_LIMITS = RelayLimits(duration=120, data=4 << 20, max_circuit_conns=8, max_reservations=0)
SLOT_SWEEP_S = 30.0  # how often a helper frees the slots of nodes that left
SLOTS_PER_IP = 8  # volunteers behind one router share an address
CIRCUITS_PER_SOURCE = 8  # circuits one peer may have open through a helper at once
PEER_BYTES_PER_HOUR = 64 << 20  # relayed from one peer: ~130 fetches of a 512 KiB bundle, hundreds of typical ones
RESERVE_EVERY_S = 30.0
RETRY_S = 10.0  # a helper that refused (full) or did not answer is asked again after this
RESERVE_TIMEOUT_S = 10.0
MAX_HELPERS = 2  # slots a node holds at once: one helper may go away
CIRCUIT = "/p2p-circuit"


def is_circuit(addr: str) -> bool:
    return CIRCUIT in addr


def relay_of(addr: str) -> str:
    """The helper's peer id in a /p2p-circuit address ("" if there is none)."""
    head = addr.split(CIRCUIT, 1)[0]
    return head.rsplit("/p2p/", 1)[1] if CIRCUIT in addr and "/p2p/" in head else ""


def circuit_addr(helper_addr: str, own_peer_id: str) -> str:
    """The address peers dial to reach us through a helper we reserved a slot on."""
    return f"{helper_addr}{CIRCUIT}/p2p/{own_peer_id}"


class _Forgetful(dict):
    """py-libp2p 0.8.1 keys its open circuits by peer (`_active_relays[peer]`), so two circuits
    that share a peer (A fetching from B while B fetches from A: every round) overwrite each
    other's entry, and the first to end closes the other's streams (the other fetch then fails
    with StreamEOF; seen in the lab). Nothing is stored here: each circuit closes its own streams
    (`CountingRelay._relay_data`)."""

    def __setitem__(self, key, value) -> None:
        pass


class CountingRelay(CircuitV2Protocol):
    """The hop (and stop) side of circuit relay v2, counting what it copies, with the per-peer
    bounds py-libp2p 0.8.1 lacks:
    - a slot is for the peer asking (0.8.1 reserved for any peer id the request named: one stream
      could take every slot), at most SLOTS_PER_IP per address (a household's nodes share one),
      and a slot whose holder disconnected is freed (`drop_departed`) rather than held an hour;
    - at most CIRCUITS_PER_SOURCE circuits open at once from one peer (0.8.1 counted only the
      destination's), and at most PEER_BYTES_PER_HOUR relayed from one peer;
    - each circuit closes its own streams and lasts at most its duration, idle or not;
    - a node (no hop) accepts relayed connections only through helpers it holds a slot on."""

    def __init__(self, host, limits: RelayLimits, allow_hop: bool, stop_from: Callable[[str], bool] | None = None) -> None:
        super().__init__(host, limits=limits, allow_hop=allow_hop)
        self._active_relays = _Forgetful()
        self._stop_from = stop_from  # relays we accept circuits through; None: any (a helper)
        self.relayed_bytes = 0
        self._directions = 0  # relay loops running: two per circuit
        self._slot_ip: dict[ID, str] = {}
        self._circuits_from: dict[ID, int] = {}
        self._bytes_from: dict[ID, int] = {}
        self._bytes_since = time.monotonic()

    async def _handle_reserve(self, stream, msg) -> None:  # type: ignore[override]
        peer = stream.muxed_conn.peer_id
        msg.peer.id = peer.to_bytes()  # a slot for the peer asking, never for an id it names
        ip = remote_ip(stream) or "?"
        if not self.resource_manager.has_reservation(peer) and \
                sum(1 for p, a in self._slot_ip.items() if a == ip and self.holds_slot(p.to_base58())) >= SLOTS_PER_IP:
            await self._send_status(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "too many slots from this address")
            return
        self._slot_ip[peer] = ip
        await super()._handle_reserve(stream, msg)

    async def _handle_connect(self, stream, msg) -> None:  # type: ignore[override]
        source = stream.muxed_conn.peer_id
        if self._circuits_from.get(source, 0) >= CIRCUITS_PER_SOURCE:
            await self._send_status(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "too many circuits from this peer")
            await stream.reset()
            return
        self._circuits_from[source] = self._circuits_from.get(source, 0) + 1
        try:
            await super()._handle_connect(stream, msg)
        finally:
            self._circuits_from[source] -= 1
            if not self._circuits_from[source]:
                del self._circuits_from[source]

    async def _handle_stop_stream(self, stream) -> None:  # type: ignore[override]
        if self._stop_from is not None and not self._stop_from(stream.muxed_conn.peer_id.to_base58()):
            await stream.reset()  # a circuit through a relay we never asked for a slot
            return
        await super()._handle_stop_stream(stream)

    async def _relay_data(self, src_stream, dst_stream, peer_id, deadline=None, circuit_data_limit=None) -> None:  # type: ignore[override]
        self._directions += 1
        try:
            # py-libp2p checks the duration only when bytes arrive: an idle circuit lasted for ever
            with trio.move_on_after(self.limits.duration + 1.0):
                await super()._relay_data(src_stream, dst_stream, peer_id, deadline, circuit_data_limit)
        finally:
            self._directions -= 1
            with trio.CancelScope(shield=True):
                await self._close_stream(src_stream)
                await self._close_stream(dst_stream)

    async def _read_stream_with_retry(self, stream, max_retries: int = 3):  # type: ignore[override]
        # The one place py-libp2p 0.8.1's relay loop reads what it then writes to the other side.
        data = await super()._read_stream_with_retry(stream, max_retries)
        if data:
            if time.monotonic() - self._bytes_since > 3600.0:
                self._bytes_from, self._bytes_since = {}, time.monotonic()
            sender = stream.muxed_conn.peer_id
            self._bytes_from[sender] = self._bytes_from.get(sender, 0) + len(data)
            if self._bytes_from[sender] > PEER_BYTES_PER_HOUR:
                return None  # ends this circuit as if the sender had closed it
            self.relayed_bytes += len(data)
        return data

    def drop_departed(self, connected: set[ID]) -> int:
        """Free the slots of peers no longer connected (trio side); how many were freed."""
        manager = self.resource_manager
        gone = [p for p in list(manager._reservations) if p not in connected]
        for peer in gone:
            manager._reservations.pop(peer, None)
            self._slot_ip.pop(peer, None)
        return len(gone)

    def reservations(self) -> int:
        """Slots held now (any thread: counts without touching py-libp2p's state)."""
        return sum(not r.is_expired() for r in list(self.resource_manager._reservations.values()))

    def holds_slot(self, peer: str) -> bool:
        reservation = self.resource_manager._reservations.get(ID.from_base58(peer))
        return reservation is not None and not reservation.is_expired()

    def circuits(self) -> int:
        return self._directions // 2


class RelayClient:
    """A node's side: reserve slots on helpers, dial peers through theirs (trio side only)."""

    def __init__(self, host, relay: CountingRelay) -> None:
        self._host = host
        # STOP only: with CLIENT, py-libp2p's own dial reserved a slot on the author's helper before
        # every circuit dial (each fetcher then held one for an hour); we reserve by hand.
        self._transport = CircuitV2Transport(host, relay, RelayConfig(roles=RelayRole.STOP))
        self.reserved: dict[str, float] = {}  # helper peer id -> when the last reservation succeeded
        self._tried: dict[str, float] = {}  # helper peer id -> when we last asked it

    def due(self, helper: str) -> bool:
        """Time to ask `helper` (again): renewals every RESERVE_EVERY_S, retries every RETRY_S."""
        wait = RESERVE_EVERY_S if helper in self.reserved else RETRY_S
        return time.monotonic() - self._tried.get(helper, -1e9) > wait

    async def reserve(self, helper: str) -> bool:
        """Ask `helper` for a slot (or renew ours); False when it refused or did not answer."""
        pid = ID.from_base58(helper)
        self._tried[helper] = time.monotonic()
        with trio.move_on_after(RESERVE_TIMEOUT_S):
            try:
                stream = await self._host.new_stream(pid, [HOP_PROTOCOL])
                try:
                    ok = await self._transport._make_reservation(stream, pid)
                finally:
                    with trio.move_on_after(2.0):
                        await stream.close()
            except Exception as exc:  # noqa: BLE001 — not a helper, or gone
                log.debug("reservation on %s failed: %s", helper[:16], exc)
                ok = False
            if ok:
                self.reserved[helper] = time.monotonic()
            else:
                self.reserved.pop(helper, None)
            return ok
        self.reserved.pop(helper, None)
        return False

    def forget(self, helper: str) -> None:
        """The helper went away: our slot there is gone, and it is asked again as soon as it is back."""
        self.reserved.pop(helper, None)
        self._tried.pop(helper, None)

    async def dial(self, addr: str) -> None:
        """Connect to a peer at a /p2p-circuit address through the helper it names (raises when
        the helper or the peer refuses). The CONNECT goes to that helper only: py-libp2p's own
        dial first tried every circuit address it ever stored for the peer (a helper it has left)."""
        maddr = multiaddr.Multiaddr(addr)
        relay_maddr, dest = self._transport.parse_circuit_ma(maddr)
        relay = ID.from_base58(relay_of(addr))
        if relay not in self._host.get_connected_peers():  # another helper: its address is in the circuit's
            self._host.get_peerstore().add_addrs(relay, [relay_maddr.decapsulate(multiaddr.Multiaddr(f"/p2p/{relay}"))], 600)
        raw = await self._transport._dial_via_circuit_addr(maddr, PeerInfo(dest, [maddr]))
        await self._host.upgrade_outbound_connection(raw, dest)


def is_helper(host, peer: str, dialback: str) -> bool:
    """Identify told us the peer is one of our swarm's helpers: it serves our swarm's dial-back
    protocol and the relay's hop (any libp2p relay is not: its limits and answers are not ours)."""
    try:
        return len(host.get_peerstore().supports_protocols(ID.from_base58(peer), [dialback, str(HOP_PROTOCOL)])) == 2
    except Exception:  # noqa: BLE001 — unknown peer
        return False


def relayed_only(host, peer: ID) -> bool:
    """Every connection we have with `peer` runs through a helper's relay (and there is one)."""
    conns = host.get_network().connections.get(peer) or []
    if not isinstance(conns, list):
        conns = [conns]
    try:
        return bool(conns) and all(any(CIRCUIT in str(a) for a in c.get_transport_addresses()) for c in conns)
    except Exception:  # noqa: BLE001 — a connection closing under us: not known to be relayed
        return False


async def free_departed_slots(host, relay: CountingRelay) -> None:
    """A helper frees the relay slots of nodes that left, every SLOT_SWEEP_S (py-libp2p keeps them
    for their whole hour, so departed nodes would fill the helper)."""
    while True:
        await trio.sleep(SLOT_SWEEP_S)
        freed = relay.drop_departed(set(host.get_connected_peers()))
        if freed:
            log.info("freed %d relay slot(s) of nodes that left", freed)


def relay_figures(relay: CountingRelay | None, dialback) -> dict:
    """A helper's relay: slots held, circuits open, bytes copied, dial-backs answered."""
    return {
        "reservations": relay.reservations() if relay else 0,
        "circuits": relay.circuits() if relay else 0,
        "relayed_bytes": relay.relayed_bytes if relay else 0,
        "dialbacks": dialback.answered if dialback else 0,
    }

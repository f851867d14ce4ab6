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

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

log = logging.getLogger("swarmling.swarm")

# What one helper gives: a bundle is ≤ 512 KiB and crosses in seconds, so a circuit lasts two
# minutes and carries 4 MiB at most; a reserved node takes 8 circuits at once; 256 nodes hold a
# slot (a slot is a few hundred bytes of state; the bytes are what costs, and those are bounded
# per circuit). A reservation lasts an hour and is renewed well before.
HELPER_LIMITS = RelayLimits(duration=120, data=4 << 20, max_circuit_conns=8, max_reservations=256,
                            reservation_ttl=3600)
NODE_LIMITS = RelayLimits(duration=120, data=4 << 20, max_circuit_conns=8, max_reservations=0)
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
    """The hop (and stop) side of circuit relay v2, counting what it copies; each circuit closes
    its own streams and lasts at most its duration, idle or not."""

    def __init__(self, host, limits: RelayLimits, allow_hop: bool) -> None:
        super().__init__(host, limits=limits, allow_hop=allow_hop)
        self._active_relays = _Forgetful()
        self.relayed_bytes = 0
        self._directions = 0  # relay loops running: two per circuit

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
            self.relayed_bytes += len(data)
        return data

    def reservations(self) -> int:
        manager = self.resource_manager
        manager._clean_expired()
        return len(manager._reservations)

    def holds_slot(self, peer: str) -> bool:
        reservation = self.resource_manager._reservations.get(ID.from_base58(peer))
        return reservation is not None and not reservation.is_expired()

    def circuits(self) -> int:
        return self._directions // 2


class RelayClient:
    """A node's side: reserve slots on helpers, dial peers through theirs (trio side only)."""

    def __init__(self, host, relay: CountingRelay) -> None:
        self._host = host
        self._transport = CircuitV2Transport(host, relay, RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT))
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
        """Connect to a peer at a /p2p-circuit address (raises when the helper or the peer refuses)."""
        await self._transport.dial(multiaddr.Multiaddr(addr))


def is_helper(host, peer: str) -> bool:
    """Identify told us the peer runs the relay's hop side."""
    try:
        return bool(host.get_peerstore().supports_protocols(ID.from_base58(peer), [str(HOP_PROTOCOL)]))
    except Exception:  # noqa: BLE001 — unknown peer
        return False

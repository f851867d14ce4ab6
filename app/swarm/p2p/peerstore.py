"""py-libp2p's peerstore, keeping only addresses a peer can really be dialled at.

identify replaces a peer's addresses with the ones it advertises (for 2 h), wildcards included
(`/ip4/0.0.0.0/tcp/38433`); py-libp2p dials only the first, and with every node on the same
default port that reaches the dialler's own listener. Here:
- wildcard addresses are never stored; loopback ones only by a node that itself listens on
  loopback (a sim, the tests) — on any other node they are the peer's own machine, not ours;
- a pinned address (one the user configured, or one we dialled successfully) survives identify's
  replacement and is dialled first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStore, PeerStoreError
from multiaddr import Multiaddr

from .addresses import is_loopback, is_unspecified

PINNED_TTL_S = 7 * 24 * 3600
MAX_PINNED = 1024


class DialablePeerstore(PeerStore):
    def __init__(self, *, loopback_ok: bool) -> None:
        super().__init__()
        self._loopback_ok = loopback_ok
        self._pinned: OrderedDict[ID, Multiaddr] = OrderedDict()

    def pin(self, peer_id: ID, addr: Multiaddr) -> None:
        """Keep `addr` for `peer_id` whatever identify says, and dial it first."""
        self._pinned[peer_id] = addr
        self._pinned.move_to_end(peer_id)
        while len(self._pinned) > MAX_PINNED:
            self._pinned.popitem(last=False)
        super().add_addrs(peer_id, [addr], PINNED_TTL_S)

    def add_addrs(self, peer_id: ID, addrs: Sequence[Multiaddr], ttl: int = 0) -> None:
        keep = [a for a in addrs if self._storable(peer_id, a)]
        if keep:
            super().add_addrs(peer_id, keep, ttl)

    def clear_addrs(self, peer_id: ID) -> None:
        super().clear_addrs(peer_id)
        if peer_id in self._pinned:
            super().add_addrs(peer_id, [self._pinned[peer_id]], PINNED_TTL_S)

    def addrs(self, peer_id: ID) -> list[Multiaddr]:
        pinned = self._pinned.get(peer_id)
        try:
            known = super().addrs(peer_id)
        except PeerStoreError:
            if pinned is None:
                raise
            known = []
        if pinned is None:
            return known
        return [pinned, *(a for a in known if a != pinned)]

    def _storable(self, peer_id: ID, addr: Multiaddr) -> bool:
        text = str(addr)
        if is_unspecified(text):
            return False
        return not is_loopback(text) or self._loopback_ok or self._pinned.get(peer_id) == addr

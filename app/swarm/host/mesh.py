"""py-libp2p's GossipSub with the mesh kept for the peers that matter (issue 41).

Reproduced with real hosts on 127.0.0.1 (two honest nodes, then two waves of 8 identities that
join their topic and trickle the bundles they announce): the identities GRAFT into both meshes
(9-12 peers), the next heartbeat prunes back to 6 choosing among equal scores, and prunes the
honest peer as readily as an attacker. py-libp2p 0.8.1 then keeps them apart:

- the pruner records no backoff of its own (only the pruned side does, 60 s), so it may GRAFT the
  peer again while that peer still refuses it; and when both sides do hold a backoff, they were
  set in the same second and expire in the same second: each side's GRAFT reaches the other
  while its backoff has a moment left, is answered with PRUNE and renews both for 60 s. Measured:
  the honest pair stayed out of each other's mesh, the backoffs renewing every 60 s, for as long
  as the test watched (85 s), while connected and while 8-11 attackers held the mesh places.

Two changes, at that depth:

- **Pruning keeps the peers this node keeps** (its dial targets and peers whose bundles proved
  useful), then by what a peer delivered, then the longest-standing (an identity that appeared a
  minute ago goes before a peer of an hour), then peers that announced anything. A pruned peer is
  backed off here too, as go-libp2p does.
- **A GRAFT in the last seconds of a backoff is accepted** (go-libp2p waits out a slack beyond the
  backoff before it grafts; py-libp2p does not, so the two sides' expiries collide).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub

from .admission import Rank

# Beyond a few heartbeats (1 s each) of clock and delivery skew between two sides' backoffs.
GRAFT_BACKOFF_SLACK_S = 3


class KeepingGossipSub(GossipSub):
    def __init__(self, *args, keeps: Callable[[str], bool], rank: Rank, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keeps = keeps  # dial targets and proven peers: pruned last
        self._rank = rank  # (announced anything, delivered score): the rest by this
        self._since: dict[ID, float] = {}  # when each gossip peer appeared

    def add_peer(self, peer_id: ID, protocol_id) -> None:
        self._since.setdefault(peer_id, time.monotonic())
        super().add_peer(peer_id, protocol_id)

    def remove_peer(self, peer_id: ID) -> None:
        self._since.pop(peer_id, None)
        super().remove_peer(peer_id)

    def _select_peers_for_pruning(self, topic: str, num_to_prune: int) -> list[ID]:
        mesh = list(self.mesh.get(topic, ()))
        if num_to_prune <= 0 or not mesh:
            return []
        random.shuffle(mesh)  # among equals, any

        now = time.monotonic()

        def worth(peer: ID) -> tuple[bool, float, float, bool, float]:
            name = peer.to_base58()
            heard, delivered = self._rank(name)
            gossip = self.scorer.score(peer, [topic]) if self.scorer is not None else 0.0
            return self._keeps(name), delivered, now - self._since.get(peer, now), heard, gossip

        pruned = sorted(mesh, key=worth)[:num_to_prune]
        for peer in pruned:  # as the pruned side will: neither grafts the other for a while
            self._add_back_off(peer, topic, False)
        return pruned

    async def handle_graft(self, graft_msg, sender_peer_id: ID) -> None:
        topic = graft_msg.topicID
        until = self.back_off.get(topic, {}).get(sender_peer_id)
        if until is not None and until - time.time() <= GRAFT_BACKOFF_SLACK_S:
            del self.back_off[topic][sender_peer_id]  # its backoff and ours ran out together
        await super().handle_graft(graft_msg, sender_peer_id)

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

- **Pruning keeps the peers this node keeps.** When the mesh is over its upper bound, peers the
  gossip score penalises go first, then (of the rest) peers that are neither dial targets nor
  proven, then by what a peer delivered, then the newest (age in doubling buckets: 1 s, 2 s, 4 s …
  capped at ~1 h, so peers of about the same age tie), then those that announced nothing, then at
  random. An identity that appeared seconds ago goes before a peer of minutes. (The library's
  own replacement of the lowest-scored mesh peer, once a beat, is left as it is: it acts on a
  peer's misbehaviour, not on a crowd.)
- **A GRAFT in the last seconds of a backoff is accepted** (go-libp2p waits out a slack beyond the
  backoff before it grafts; py-libp2p does not, so the two sides' expiries collide). Should the
  library refuse that GRAFT for another reason, the backoff is put back.

The pruner records no backoff of its own (go-libp2p does): here it would also stop the IHAVE
gossip a pruned peer still gets from us, which py-libp2p withholds from peers in backoff.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.utils import safe_bytes_from_hex

from .admission import Rank
from .forwarding import UploadBudget

# Beyond a few heartbeats (1 s each) of clock and delivery skew between two sides' backoffs.
GRAFT_BACKOFF_SLACK_S = 3
MAX_AGE_BUCKET = 12  # 2^12 s: past about an hour, age no longer orders peers


class KeepingGossipSub(GossipSub):
    def __init__(self, *args, keeps: Callable[[str], bool], rank: Rank, forwarding: UploadBudget | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keeps = keeps  # dial targets and proven peers: pruned last
        self._rank = rank  # (announced anything, delivered score): the rest by this
        self._since: dict[ID, float] = {}  # when each gossip peer appeared
        self.forwarding = forwarding  # what forwarding others' messages may upload (forwarding.py); None: unbounded

    async def publish(self, msg_forwarder: ID, pubsub_msg) -> None:
        """Our own messages, and those of origins this node keeps (dial targets, proven peers), always
        go out; any other peer's is pushed to the mesh within the budget (it has been validated and
        delivered to this node either way). One over budget is still cached, so the heartbeat's
        IHAVE gossip advertises it and a neighbour that wants it pulls it, once there is budget
        again: a flood slows what it crowds out to the gossip's pace instead of stopping it here."""
        if (self.forwarding is not None and self.pubsub is not None and msg_forwarder != self.pubsub.my_id
                and self._budgeted(pubsub_msg)):
            skip = {msg_forwarder, ID(pubsub_msg.from_id)}
            copies = sum(len(set(self.mesh.get(topic, ())) - skip) for topic in pubsub_msg.topicIDs)
            if copies and not self.forwarding.take(pubsub_msg.ByteSize() * copies):
                self.mcache.put(pubsub_msg)
                return
        await super().publish(msg_forwarder, pubsub_msg)

    def _budgeted(self, msg) -> bool:
        """Whether sending `msg` on counts against the budget: another origin's, one this node does
        not keep (ours and dial targets' or proven peers' always go)."""
        origin = ID(msg.from_id)
        return origin != self.pubsub.my_id and not self._keeps(origin.to_base58())

    async def handle_iwant(self, iwant_msg, sender_peer_id: ID) -> None:
        """A neighbour's pull is an upload too: others' messages it asks for go within the same
        budget as the push (without this, what the push withheld left by IWANT at no cost); ours
        and those of origins this node keeps always go."""
        if self.forwarding is None or self.pubsub is None or self._iwant_rate_spent(sender_peer_id):
            await super().handle_iwant(iwant_msg, sender_peer_id)  # (over its rate: refused and penalised there)
            return
        granted = rpc_pb2.ControlIWant()
        for wire_id in iwant_msg.messageIDs:
            mid = safe_bytes_from_hex(wire_id)
            msg = self.mcache.get(mid) if mid is not None else None
            if msg is None:  # not ours to send: the library refuses or logs it
                granted.messageIDs.append(wire_id)
                continue
            if not self._budgeted(msg) or self.forwarding.take(msg.ByteSize(), pull=True):
                granted.messageIDs.append(wire_id)
        await super().handle_iwant(granted, sender_peer_id)  # even empty: the library counts the request

    def _iwant_rate_spent(self, peer: ID) -> bool:
        """Whether py-libp2p will refuse `peer`'s next IWANT for its rate (read, not counted: the
        library counts it), so that a refused request spends no budget."""
        try:
            recent = [t for t in self.iwant_request_limits[peer]["requests"] if t > time.time() - 1.0]
            return len(recent) >= self.max_iwant_requests_per_second
        except (AttributeError, KeyError, TypeError):  # another library version: the budget first
            return False

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
        random.shuffle(mesh)  # among equals, any (sorted() keeps this order for ties)
        return sorted(mesh, key=lambda peer: self._worth(peer, topic))[:num_to_prune]

    def _worth(self, peer: ID, topic: str) -> tuple[bool, bool, float, int, bool]:
        """Ascending: the first ones are pruned first."""
        name = peer.to_base58()
        heard, delivered = self._rank(name)
        gossip = self.scorer.score(peer, [topic]) if self.scorer is not None else 0.0
        age_s = time.monotonic() - self._since.get(peer, time.monotonic())
        return gossip >= 0, self._keeps(name), delivered, min(int(math.log2(1 + age_s)), MAX_AGE_BUCKET), heard

    async def handle_graft(self, graft_msg, sender_peer_id: ID) -> None:
        topic = graft_msg.topicID
        until = self.back_off.get(topic, {}).get(sender_peer_id)
        lifted = until is not None and until - time.time() <= GRAFT_BACKOFF_SLACK_S
        if lifted:
            del self.back_off[topic][sender_peer_id]  # its backoff and ours ran out together
        await super().handle_graft(graft_msg, sender_peer_id)
        if lifted and sender_peer_id not in self.mesh.get(topic, ()):  # refused for another reason
            self.back_off.setdefault(topic, {})[sender_peer_id] = max(until, self.back_off[topic].get(sender_peer_id, 0))

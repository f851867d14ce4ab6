"""What a node spends forwarding other peers' announcements: a budget, so a flood costs the
volunteer little upload.

GossipSub forwards every announcement the topic validator accepts to each peer in the node's mesh
(up to 12). The validator already holds each origin to the rate the board accepts
(verification/board.py: 1 a second, bursts of 5), but 30 identities at that rate still make a node
upload ~30 announcements a second times its mesh. All forwarding together is held to
FORWARD_KIB_S (less where `resources.bandwidth_kib_s` is lower): what is over it is still read,
checked and used by this node, and not pushed on (it stays in the message cache, so neighbours
can still pull it through IHAVE gossip). The node's own announcements, and those of origins it
keeps (dial targets, proven peers), never count against it. A helper (`swarmling relay`) is the
swarm's hub and forwards without this budget.

The figure: a full shard (32 announcers) of nodes on 60 s rounds makes a node forward about 0.5
announcements a second, ~2 KiB each on the wire to 6 mesh peers: ~6 KiB/s at rest. The budget is
ten times that, and above what a shard of 15 s rounds forwards (~26 KiB/s) only in bursts.
"""

from __future__ import annotations

import threading
import time

FORWARD_KIB_S = 64.0
BURST_S = 4.0  # seconds of budget that can be spent at once (a helper's restart flushes a queue)


class ForwardBudget:
    """A token bucket over the bytes the node forwards (each copy counts); thread-safe, so the
    round loop may change its rate (`resources.bandwidth_kib_s` is a live setting)."""

    def __init__(self, kib_s: float = FORWARD_KIB_S, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rate = kib_s * 1024
        self._tokens = self._rate * BURST_S
        self._stamp = clock()
        self.forwarded_bytes = 0
        self.withheld = 0  # announcements not forwarded for want of budget

    @property
    def kib_s(self) -> float:
        return self._rate / 1024

    @kib_s.setter
    def kib_s(self, value: float) -> None:
        with self._lock:
            self._rate = value * 1024
            self._tokens = min(self._tokens, self._rate * BURST_S)

    def take(self, copies_bytes: int) -> bool:
        """Whether forwarding `copies_bytes` (a message's size times the peers it goes to) fits now.
        A message costing more than the whole burst goes when the bucket is full (charged the burst):
        under a low cap forwarding slows down, never stops."""
        with self._lock:
            now = self._clock()
            capacity = self._rate * BURST_S
            self._tokens = min(capacity, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            copies_bytes = min(copies_bytes, capacity)
            if copies_bytes > self._tokens:
                self.withheld += 1
                return False
            self._tokens -= copies_bytes
            self.forwarded_bytes += copies_bytes
            return True

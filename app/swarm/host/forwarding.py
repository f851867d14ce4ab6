"""What a node uploads for others, within a budget: forwarding other peers' announcements (so a
flood costs the volunteer little upload) and, under `resources.bandwidth_kib_s`, serving bundles.

GossipSub forwards every announcement the topic validator accepts to each peer in the node's mesh
(up to 12). The validator already holds each origin to the rate the board accepts
(verification/board.py: 1 a second, bursts of 5), but 30 identities at that rate still make a node
upload ~30 announcements a second times its mesh. All forwarding together is held to
FORWARD_KIB_S (less where half of `resources.bandwidth_kib_s` is lower): what is over it is still
read, checked and used by this node, and not pushed on (it stays in the message cache, so
neighbours can still pull it through IHAVE gossip, within the same budget: mesh.py's
handle_iwant). The node's own announcements, and those of origins it keeps (dial targets, proven
peers), never count against it. A helper (`swarmling relay`) is the
swarm's hub and forwards without this budget.

The figure: a full shard (32 announcers) of nodes on 60 s rounds makes a node forward about 0.5
announcements a second, ~2 KiB each on the wire to 6 mesh peers: ~6 KiB/s at rest. The budget is
ten times that, and above what a shard of 15 s rounds forwards (~26 KiB/s) only in bursts.

Where the user caps the swarm's traffic (`resources.bandwidth_kib_s`), the upload is split in
halves: forwarding gets half the cap (or its own budget, if lower), serving our bundles the other
half, with SERVE_BURST_S of burst (a cap is an average over a round; a round's bundle goes to
several peers at once). A request over it is answered "busy" (bundle_protocol.py): the fetcher
is not blamed and may ask again. Without a cap, serving is bounded by its slots alone.
"""

from __future__ import annotations

import threading
import time

FORWARD_KIB_S = 64.0
BURST_S = 4.0  # seconds of budget that can be spent at once (a helper's restart flushes a queue)
SERVE_BURST_S = 30.0  # serving's burst: about half a CPU node's round


def split_cap(kib_s: float | None, forward_ceiling: float) -> tuple[float, float]:
    """(forwarding's rate, serving's rate) in KiB/s under the user's cap `kib_s` (None: no cap)."""
    if not kib_s:
        return forward_ceiling, float("inf")
    return min(forward_ceiling, kib_s / 2), kib_s / 2


class UploadBudget:
    """A token bucket over the bytes the node uploads (each copy forwarded counts); thread-safe, so
    the round loop may change its rate (`resources.bandwidth_kib_s` is a live setting)."""

    def __init__(self, kib_s: float = FORWARD_KIB_S, clock=time.monotonic, burst_s: float = BURST_S,
                 average: bool = False) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._burst_s = burst_s
        # Holds the rate on average, not only per burst: what costs more than the whole burst goes
        # once the bucket is full and is charged in full (the bucket runs into debt).
        self._average = average
        self._rate = kib_s * 1024
        self._tokens = self._rate * burst_s
        self._stamp = clock()
        self.spent_bytes = 0
        self.withheld = 0  # announcements not forwarded, or bundles not served, for want of budget
        self.pulls_withheld = 0  # messages a neighbour asked for by IWANT and did not get (mesh.py)

    @property
    def kib_s(self) -> float:
        return self._rate / 1024

    @kib_s.setter
    def kib_s(self, value: float) -> None:
        with self._lock:
            self._rate = value * 1024
            self._tokens = min(self._tokens, self._rate * self._burst_s)

    def take(self, copies_bytes: int, pull: bool = False) -> bool:
        """Whether forwarding `copies_bytes` (a message's size times the peers it goes to) fits now.
        A message costing more than the whole burst goes when the bucket is full (charged the burst):
        under a low cap forwarding slows down, never stops. An infinite rate takes everything.
        `pull`: a message a neighbour asked for (a refusal counts in `pulls_withheld`)."""
        with self._lock:
            if self._rate == float("inf"):
                self.spent_bytes += copies_bytes
                return True
            now = self._clock()
            capacity = self._rate * self._burst_s
            self._tokens = min(capacity, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            needed = min(copies_bytes, capacity)
            if not self._average:
                copies_bytes = needed
            if needed > self._tokens:
                if pull:
                    self.pulls_withheld += 1
                else:
                    self.withheld += 1
                return False
            self._tokens -= copies_bytes
            self.spent_bytes += copies_bytes
            return True


def serving_budget() -> UploadBudget:
    """Serving our bundles: unbounded but for its upload slots until the user caps the upload
    (network.cap_upload), then held to the cap on average."""
    return UploadBudget(float("inf"), burst_s=SERVE_BURST_S, average=True)

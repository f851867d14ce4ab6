"""Announcements heard from the swarm, and the choice of which bundles to fetch.

`offer()` runs as the gossip topic validator on the network thread: whatever it refuses is not
relayed. A refusal is REJECT when the forwarder should have refused it too (malformed, forged,
another swarm): GossipSub then counts it against the forwarder. It is IGNORE when the forwarder
may well have been right: an origin over its rate, a re-announced digest, a clock far from ours,
an announcement older than one already heard from its origin. Forwarders see bursts at other times than we do (py-libp2p flushes messages queued while a peer
was away all at once), so counting those against them graylisted a helper's nodes after its
restart: the helper stopped forwarding anything to them. An origin far over its rate (FLOOD_BURST
beyond it) is a flood, and rejected again: honest bursts after a gap are a few announcements.
It rate-limits each origin (a token bucket), keeps a bounded number of recent announcements per
origin and in all, and never does more than decode a small message.

Replays (issue 27): an announcement is signed, so anyone can send it again verbatim, and GossipSub
forgets a message's id after two minutes. One older than the newest heard from its origin is
ignored (an author announces once a round, so its timestamps only grow), as is a digest heard
already; what is left, an old announcement to a node that never heard its origin, is fetched at
most once (the fetcher's `_taken`, the author's `ServedOnce`). MAX_CLOCK_SKEW_S stays 600 s: it is
the volunteers' clock tolerance too, and with those rules a replay inside it costs the check.

`choose()` runs on the round loop: it picks the bundles worth fetching this round, one per peer,
within the round's inbound byte budget — so a node's inbound traffic is bounded by its budget, not
by the swarm's size. What peers *claim* (a learning signal in their announcement) only orders
bundles within a tier; the tiers follow what peers *delivered* (reputation.py):
- proven peers (a positive score) first, drawn at random weighted by their score, within the
  budget less a share kept for the others (NEWCOMER_SHARE);
- everyone else — newcomers before peers with a poor record — at most NEWCOMER_BUNDLES a round,
  so throw-away identities announcing bait can never take more than that, and a newcomer still
  gets the chance to earn a standing.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .wire import Announcement, WireError, decode_announcement

MAX_ORIGINS = 512
PER_ORIGIN = 4  # most recent announcements kept per origin
MAX_CLOCK_SKEW_S = 600.0
FLOOD_BURST = 20  # over-rate announcements of one origin ignored before they count as a flood
NEWCOMER_BUNDLES = 3  # bundles a round from peers without a positive record
NEWCOMER_SHARE = 0.25  # of the budget, kept from proven peers for them


class Verdict(enum.Enum):
    """What the gossip validator says of one announcement (truthy only when accepted)."""

    ACCEPT = "accept"
    IGNORE = "ignore"  # dropped, the forwarder not blamed
    REJECT = "reject"  # dropped, counted against the forwarder

    def __bool__(self) -> bool:
        return self is Verdict.ACCEPT


@dataclass(frozen=True)
class Heard:
    origin: str
    announcement: Announcement
    received: float  # wall clock, for announcement latency and freshness

    @property
    def signal_groups(self) -> int:
        """Groups the sender scored as neither all-right nor all-wrong: likely to teach something."""
        return sum(0.0 < g.reward_mean < 1.0 for g in self.announcement.groups)


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate_per_s, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Board:
    def __init__(
        self,
        swarm: str,
        self_id: str,
        *,
        rate_per_s: float = 1.0,
        burst: float = 5.0,
        ttl_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.swarm, self.self_id = swarm, self_id
        self.rate_per_s, self.burst, self.ttl_s, self.clock = rate_per_s, burst, ttl_s, clock
        self._lock = threading.Lock()
        self._heard: OrderedDict[str, deque[Heard]] = OrderedDict()  # origin -> recent, LRU by origin
        self._buckets: dict[str, tuple[TokenBucket, TokenBucket]] = {}  # origin -> (rate, flood)
        self._taken: set[str] = set()  # digests already chosen for fetching
        self._newest: dict[str, float] = {}  # origin -> timestamp of its newest announcement accepted
        self.refused: dict[str, int] = {}  # reason -> count, for the log and the metrics
        self.received = 0
        self._latencies: deque[float] = deque(maxlen=256)  # publish → validated here, seconds

    def _refuse(self, reason: str, verdict: Verdict = Verdict.REJECT) -> Verdict:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return verdict

    def offer(self, origin: str, data: bytes) -> Verdict:
        """Validate one gossiped announcement: accepted, ignored, or rejected (see the module's docstring)."""
        now = self.clock()
        with self._lock:
            buckets = self._buckets.get(origin)
            if buckets is None:
                if len(self._buckets) >= 4 * MAX_ORIGINS:
                    self._buckets.clear()  # a flood of fresh identities: start counting over
                    self._newest = {o: self._newest[o] for o in self._heard if o in self._newest}
                buckets = self._buckets[origin] = (TokenBucket(self.rate_per_s, self.burst, now),
                                                   TokenBucket(self.rate_per_s, self.burst + FLOOD_BURST, now))
            rate, flood = buckets
            within_flood = flood.take(now)
            if not rate.take(now):
                return self._refuse("rate limit", Verdict.IGNORE) if within_flood else self._refuse("flood")
            try:
                ann = decode_announcement(data)
            except WireError:
                return self._refuse("malformed")
            if ann.node_id != origin:
                return self._refuse("node id is not the signer")
            if ann.swarm != self.swarm:
                return self._refuse("another swarm")
            if abs(ann.timestamp - now) > MAX_CLOCK_SKEW_S:
                return self._refuse("stale or from the future", Verdict.IGNORE)
            if ann.timestamp < self._newest.get(origin, float("-inf")):
                return self._refuse("older than one heard", Verdict.IGNORE)
            recent = self._heard.pop(origin, None) or deque(maxlen=PER_ORIGIN)
            if any(h.announcement.digest == ann.digest for h in recent):
                self._heard[origin] = recent
                return self._refuse("duplicate", Verdict.IGNORE)
            recent.append(Heard(origin, ann, now))
            self._newest[origin] = max(ann.timestamp, self._newest.get(origin, float("-inf")))
            self._heard[origin] = recent
            while len(self._heard) > MAX_ORIGINS:
                self._heard.popitem(last=False)
            self.received += 1
            self._latencies.append(max(0.0, now - ann.timestamp))
            return Verdict.ACCEPT

    def take_latencies(self) -> list[float]:
        with self._lock:
            out = list(self._latencies)
            self._latencies.clear()
            return out

    def fresh(self) -> list[Heard]:
        now = self.clock()
        with self._lock:
            return [h for q in self._heard.values() for h in q if now - h.received <= self.ttl_s]

    def choose(
        self,
        budget_bytes: int,
        rng: np.random.Generator,
        *,
        avoid: Callable[[str], bool] = lambda origin: False,
        score: Callable[[str], float | None] = lambda origin: None,
        max_bundles: int = 8,
    ) -> list[Heard]:
        """Bundles to fetch this round: unfetched, one per peer, proven peers first, within the budget.

        `score(origin)` is the peer's delivered record (None: nothing on record)."""
        with self._lock:
            taken = set(self._taken)
        latest: dict[str, Heard] = {}
        for h in self.fresh():
            if h.announcement.digest in taken or avoid(h.origin):
                continue
            if h.origin not in latest or h.announcement.round > latest[h.origin].announcement.round:
                latest[h.origin] = h
        scores = {origin: score(origin) for origin in latest}
        proven = [h for h in latest.values() if (scores[h.origin] or 0.0) > 0]
        others = [h for h in latest.values() if (scores[h.origin] or 0.0) <= 0]
        # Efraimidis–Spirakis keys: a random order in which higher scores tend to come first.
        keys = {h.origin: rng.random() ** (1.0 / scores[h.origin]) for h in proven}
        proven.sort(key=lambda h: (h.signal_groups > 0, keys[h.origin]), reverse=True)
        draw = {h.origin: rng.random() for h in others}
        # Newcomers first, then the least bad records; a claimed signal only breaks ties.
        others.sort(key=lambda h: (scores[h.origin] is not None, -(scores[h.origin] or 0.0), h.signal_groups == 0,
                                   draw[h.origin]))
        kept = int(NEWCOMER_SHARE * budget_bytes) if others else 0
        chosen = _fill([], proven, budget_bytes - kept, max_bundles)
        chosen = _fill(chosen, others, budget_bytes, min(max_bundles, len(chosen) + NEWCOMER_BUNDLES))
        with self._lock:
            self._taken.update(h.announcement.digest for h in chosen)
            if len(self._taken) > 8192:
                self._taken = {h.announcement.digest for q in self._heard.values() for h in q}
        return chosen

    def heard_from(self, origin: str) -> bool:
        """Whether an announcement of `origin`'s is on the board (kept, so it passed validation)."""
        with self._lock:
            return origin in self._heard

    def peers_heard(self) -> int:
        return len({h.origin for h in self.fresh()})


def _fill(chosen: list[Heard], pool: list[Heard], budget_bytes: int, max_bundles: int) -> list[Heard]:
    """`chosen` plus bundles from `pool`, in order, while they fit the budget and the count."""
    spent = sum(h.announcement.size for h in chosen)
    for h in pool:
        if len(chosen) >= max_bundles:
            break
        if spent + h.announcement.size <= budget_bytes:
            chosen.append(h)
            spent += h.announcement.size
    return chosen

"""Announcements sharded over GossipSub topics, so what a node hears is bounded by a shard, not the swarm.

GossipSub hands a node every message of every topic it subscribes to (several times over: once per
mesh peer that forwards it), so with one topic each node's inbound gossip grows with the swarm.
Here the swarm splits into 2^level shards, each its own topic, once it is big enough:

- a node's shard at level k is the low k bits of sha256(peer id): shards nest (shard s at level k
  is the union of shards s and s + 2^k at level k+1), so nodes whose estimates differ still share
  the coarser topics;
- level 0 is the one topic every node used before (`/swarmling/<swarm>/<v>/announce`): a swarm of
  up to SPLIT_ABOVE nodes behaves exactly as before, everyone hears everyone;
- a node estimates the swarm's size from the announcers it heard in its own shard
  (estimate = (1 + heard) × 2^level) and changes level only when the estimate leaves a band
  (above SPLIT_ABOVE or below MERGE_BELOW per shard) for CONFIRM_ROUNDS rounds in a row, landing
  at the coarsest level with at most LAND_AT_MOST per shard (so per-shard counts stay within
  MERGE_BELOW..SPLIT_ABOVE, 12..32); a change reversing the previous one doubles the rounds needed
  (flap damping), and no change is made while the last one is settling (TRANSITION_ROUNDS, during
  which the old shard's topic stays subscribed);
- a node subscribes to its shard's topic only, and publishes one message tagged with every topic
  of its chain: levels 0..k (and k+1 when a connected peer listens there, and the old level while
  a change settles). A topic nobody listens to costs nothing (GossipSub sends a message only to
  peers subscribed to one of its topics), so nodes at the same or coarser levels, or one level
  finer, of the same shard always hear each other, whatever their estimates;
- a node never ends up hearing nobody: when fewer than MIN_SHARD_NEIGHBOURS connected peers share
  its shard, it also subscribes to the finest coarser topic that enough do share (down to level 0,
  which every message carries): its neighbours then forward it what they hear;
- a shard's topic works only if its nodes are connected among themselves (GossipSub forwards a
  topic's messages only between its subscribers), which random connections do not give once
  shards are small: a node with fewer than SHARD_PEERS connected peers in its shard dials
  announcers of its shard it heard (`shard_mates_to_dial`, from their announced addresses).

Everything here is pure (no network, no clock): host.py applies the topics, network.py feeds the
estimate once a round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from statistics import median_low

SPLIT_ABOVE = 32  # announcers per shard above which the swarm splits (a swarm up to 32 nodes: one topic)
MERGE_BELOW = 12  # announcers per shard below which shards merge
LAND_AT_MOST = 24  # a change lands at the coarsest level with at most this many per shard
MAX_LEVEL = 12  # 4096 shards: 50,000–130,000 nodes
CONFIRM_ROUNDS = 3  # rounds in a row the estimate must ask for a change
MAX_CONFIRM_ROUNDS = 48  # flap damping doubles CONFIRM_ROUNDS up to this
TRANSITION_ROUNDS = 3  # rounds the old shard's topic stays subscribed after a change (no change meanwhile)
MIN_SHARD_NEIGHBOURS = 3  # connected peers sharing our shard below which a coarser topic is added
SHARD_PEERS = 4  # connected peers of our shard a node dials announcers of its shard to keep (GossipSub's degree_low)


def shard_of(peer_id: str, level: int) -> int:
    """The peer's shard among 2^level: the low `level` bits of sha256(peer id), so shards nest."""
    if level <= 0:
        return 0
    value = int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big")
    return value & ((1 << level) - 1)


def topic(root: str, level: int, shard: int) -> str:
    """Level 0 is the swarm's one topic (`root`); deeper levels are `root/<shard count>/<shard>`."""
    return root if level <= 0 else f"{root}/{1 << level}/{shard}"


def home_topic(root: str, peer_id: str, level: int) -> str:
    return topic(root, level, shard_of(peer_id, level))


def parse_topic(root: str, name: str) -> tuple[int, int] | None:
    """(level, shard) of one of this swarm's announcement topics; None for any other topic."""
    if name == root:
        return 0, 0
    if not name.startswith(root + "/"):
        return None
    parts = name[len(root) + 1:].split("/")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 5 for p in parts):
        return None
    count, shard = int(parts[0]), int(parts[1])
    level = count.bit_length() - 1
    if count < 2 or count != 1 << level or level > MAX_LEVEL or shard >= count:
        return None
    return level, shard


def landing_level(estimate: float) -> int:
    """The level a change lands at: 0 (one topic) up to SPLIT_ABOVE nodes, else the coarsest
    level with at most LAND_AT_MOST nodes per shard."""
    if estimate <= SPLIT_ABOVE:
        return 0
    level = 1
    while level < MAX_LEVEL and estimate / (1 << level) > LAND_AT_MOST:
        level += 1
    return level


def wanted_level(estimate: float, level: int) -> int:
    """`level` while the estimate stays in its band, else where a change would land."""
    per_shard = estimate / (1 << level)
    if per_shard > SPLIT_ABOVE or (level > 0 and per_shard < MERGE_BELOW):
        return landing_level(estimate)
    return level


def estimate_size(peer_id: str, level: int, heard: Iterable[str]) -> int:
    """The swarm's size as seen from our shard: (us + distinct announcers heard in it) × shards."""
    mine = shard_of(peer_id, level)
    same = {o for o in heard if o != peer_id and shard_of(o, level) == mine}
    return (1 + len(same)) << level


def hearing_level(peer_id: str, level: int, connected: Iterable[str], min_peers: int | None = None) -> int:
    """The finest level ≤ `level` at which at least `min_peers` connected peers share our shard
    (0 when none do at any level: level 0's topic is on every message). With nobody connected,
    `level` itself: there is nobody to fall back on."""
    min_peers = MIN_SHARD_NEIGHBOURS if min_peers is None else min_peers
    peers = [p for p in connected if p != peer_id]
    if not peers:
        return level
    for j in range(level, 0, -1):
        mine = shard_of(peer_id, j)
        if sum(shard_of(p, j) == mine for p in peers) >= min_peers:
            return j
    return 0


def subscriptions(root: str, peer_id: str, level: int, previous: int | None, connected: Iterable[str],
                  min_peers: int | None = None) -> tuple[str, ...]:
    """Our shard's topic, the old one while a change settles, and a coarser one when too few
    connected peers share our shard."""
    levels = [level]
    if previous is not None and previous != level:
        levels.append(previous)
    fallback = hearing_level(peer_id, level, connected, min_peers)
    if fallback < min(levels):
        levels.append(fallback)
    return tuple(home_topic(root, peer_id, j) for j in levels)


def publish_topics(root: str, peer_id: str, level: int, previous: int | None,
                   listened: Callable[[str], bool] = lambda name: False) -> tuple[str, ...]:
    """The topics one announcement is tagged with: our chain from level 0 to ours (to the old
    level too while a change settles), plus one level finer when `listened(topic)` says a
    connected peer is subscribed there. At level 0 with nobody finer: the one topic, as before."""
    top = max(level, previous if previous is not None else level)
    names = [home_topic(root, peer_id, j) for j in range(top + 1)]
    finer = home_topic(root, peer_id, top + 1)
    if top < MAX_LEVEL and listened(finer):
        names.append(finer)
    return tuple(names)


def shard_mates_to_dial(peer_id: str, level: int, connected: Iterable[str], announcers: Iterable[str],
                        want: int | None = None) -> list[str]:
    """Announcers of our shard (in the order given) to dial so that `want` connected peers share it."""
    if level <= 0:
        return []
    want = SHARD_PEERS if want is None else want
    mine = shard_of(peer_id, level)
    connected = set(connected)
    missing = want - sum(shard_of(p, level) == mine for p in connected if p != peer_id)
    out: list[str] = []
    for origin in announcers:
        if len(out) >= missing:
            break
        if origin != peer_id and origin not in connected and origin not in out and shard_of(origin, level) == mine:
            out.append(origin)
    return out


class ShardLevel:
    """This node's level, changed with hysteresis once a round from what it heard (not thread-safe:
    the round loop owns it)."""

    def __init__(self, peer_id: str, level: int = 0) -> None:
        self.peer_id = peer_id
        self.level = level
        self.previous: int | None = None  # the level before the last change, while it settles
        self.estimate = 0
        self.changes = 0
        self._settling = 0
        self._confirm = CONFIRM_ROUNDS
        self._pending: int | None = None  # the level asked for in the rounds so far
        self._pending_rounds = 0
        self._last_direction = 0
        self._anchored = False

    @property
    def shards(self) -> int:
        return 1 << self.level

    def update(self, heard: Iterable[str], neighbour_levels: Sequence[int] = ()) -> int:
        """One round: `heard` are the announcers on the board, `neighbour_levels` the levels of
        connected peers' subscriptions (a newcomer starts at their median instead of at level 0,
        where it would hear all its neighbours' shards). Returns the level to use."""
        heard = list(heard)
        if not self._anchored and neighbour_levels:
            self._anchored = True
            start = min(MAX_LEVEL, max(0, median_low(neighbour_levels)))
            if start > self.level:
                self._change(start)
                self.estimate = estimate_size(self.peer_id, self.level, heard)
                return self.level
        self.estimate = estimate_size(self.peer_id, self.level, heard)
        if self._settling > 0:
            self._settling -= 1
            if self._settling == 0:
                self.previous = None
            return self.level
        want = wanted_level(self.estimate, self.level)
        if want == self.level:
            self._pending, self._pending_rounds = None, 0
            return self.level
        direction = 1 if want > self.level else -1
        if self._pending is not None and (self._pending > self.level) == (direction > 0):
            self._pending_rounds += 1
        else:
            self._pending_rounds = 1
        self._pending = want
        if self._pending_rounds >= self._confirm:
            if self._last_direction and direction != self._last_direction:
                self._confirm = min(MAX_CONFIRM_ROUNDS, self._confirm * 2)  # it went back: slower next time
            self._last_direction = direction
            self._change(want)
        return self.level

    def _change(self, level: int) -> None:
        self.previous, self.level = self.level, level
        self._settling = TRANSITION_ROUNDS
        self._pending, self._pending_rounds = None, 0
        self.changes += 1

"""The host's side of sharded announcements: the topics it subscribes to and tags its announcements
with, following the level the round loop sets once a round (the rules are shards.py's).

Runs on the host's trio thread: `apply()` once before the host is ready, then `run()` once a
second (subscriptions follow the connected peers: a node with no neighbour in its shard adds a
coarser topic at once; it leaves it only at the next `set_level()`, once a round, so connections
made for one fetch do not make it flap). `set_level()` and `neighbour_levels()` are safe from any
thread.

A message tagged with several topics we subscribe to (our shard's and the old one while a change
settles, or a fallback) is offered to each topic's validator: `validate()` answers the repeats from
a small cache, so the announcement board sees it once (it would refuse the second as a duplicate,
and a refusal costs the forwarder gossip score).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

import trio

from ..verification.shards import home_topic, parse_topic, publish_topics, subscriptions

log = logging.getLogger("swarmling.swarm")

CHECK_S = 1.0
RECENT_VERDICTS = 1024


class ShardTopics:
    def __init__(self, root: str, peer_id: str, validator: Callable[[object, object], bool]) -> None:
        self.root, self.peer_id = root, peer_id
        self._validator = validator  # (forwarder ID, pubsub message) -> accept
        self._lock = threading.Lock()
        self._level: tuple[int, int | None] = (0, None)  # (level, the previous one while a change settles)
        self._subscribed: tuple[str, ...] = ()
        self._neighbour_levels: tuple[int, ...] = ()
        self._fallbacks: set[str] = set()  # coarser topics added since the last set_level()
        self._seen_topics: set[str] = set()  # every topic subscribed since the last take_topics()
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()

    # ---- any thread ----------------------------------------------------------------------------
    def set_level(self, level: int, previous: int | None = None) -> None:
        with self._lock:
            self._level = (level, previous)
            self._fallbacks = set()

    @property
    def level(self) -> int:
        with self._lock:
            return self._level[0]

    def subscribed(self) -> tuple[str, ...]:
        with self._lock:
            return self._subscribed

    def take_topics(self) -> set[str]:
        """Every topic subscribed at some moment since the last call (what the node could hear)."""
        with self._lock:
            seen, self._seen_topics = self._seen_topics, set(self._subscribed)
            return seen

    def neighbour_levels(self) -> tuple[int, ...]:
        """Each connected peer's finest announcement level, from the topics it subscribes to."""
        with self._lock:
            return self._neighbour_levels

    # ---- the trio side -------------------------------------------------------------------------
    async def run(self, host, pubsub, nursery) -> None:
        while True:
            await trio.sleep(CHECK_S)
            await self.apply(host, pubsub, nursery)

    async def apply(self, host, pubsub, nursery) -> None:
        """Subscribe to the topics we should hear now, leave the ones we should not."""
        with self._lock:
            level, previous = self._level
        connected = [p.to_base58() for p in host.get_connected_peers()]
        want = subscriptions(self.root, self.peer_id, level, previous, connected)
        with self._lock:
            own = {home_topic(self.root, self.peer_id, j) for j in (level, previous) if j is not None}
            self._fallbacks |= set(want) - own
            want = tuple(dict.fromkeys((*want, *sorted(self._fallbacks))))
        for name in want:
            if name not in pubsub.topic_ids:
                pubsub.set_topic_validator(name, self.validate, False)
                nursery.start_soon(_drain, await pubsub.subscribe(name))
        for name in list(pubsub.topic_ids):
            if name not in want and parse_topic(self.root, name) is not None:
                await pubsub.unsubscribe(name)
                pubsub.remove_topic_validator(name)
        levels: dict[str, int] = {}
        for name, peers in list(pubsub.peer_topics.items()):
            parsed = parse_topic(self.root, name)
            if parsed is not None:
                for peer in peers:
                    key = peer.to_base58()
                    levels[key] = max(levels.get(key, 0), parsed[0])
        with self._lock:
            self._subscribed = tuple(want)
            self._seen_topics |= set(want)
            self._neighbour_levels = tuple(levels[p] for p in connected if p in levels)

    def publish_topics(self, pubsub) -> list[str]:
        """The topics our next announcement is tagged with (level 0 alone: the swarm's one topic)."""
        with self._lock:
            level, previous = self._level
        return list(publish_topics(self.root, self.peer_id, level, previous,
                                   lambda name: bool(pubsub.peer_topics.get(name))))

    def home(self) -> str:
        return home_topic(self.root, self.peer_id, self.level)

    def validate(self, forwarder, msg) -> bool:
        """The host's validator, once per message however many of our topics it carries."""
        key = bytes(msg.from_id) + b"/" + bytes(msg.seqno)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = bool(self._validator(forwarder, msg))
            self._verdicts[key] = verdict
            while len(self._verdicts) > RECENT_VERDICTS:
                self._verdicts.popitem(last=False)
        return verdict


async def _drain(subscription) -> None:
    # Everything we need from a message happened in the validator; a subscription is drained so
    # it does not grow, until it is left (its channel closes).
    try:
        while True:
            await subscription.get()
    except (trio.EndOfChannel, trio.ClosedResourceError):
        return

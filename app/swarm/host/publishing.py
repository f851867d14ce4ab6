"""Publishing the node's announcements on GossipSub: paced, because py-libp2p 0.8.1's `publish()`
drops silently once a peer's 32-slot queue is full; and again to a dial target that comes back
(a helper after its restart), so the swarm behind it hears of our bundle before our next round."""

from __future__ import annotations

import logging

import trio

from .dialer import Dialer
from .shard_topics import ShardTopics

log = logging.getLogger("swarmling.swarm")

PUBLISH_WAIT_S = 10.0  # longest a publish waits for peers' queues to drain
# A peer we dial (a helper, a bootstrap node) that comes back gets our latest announcement again
# at once, when it is this young: a round can last minutes, and until our next one the swarm
# behind a restarted helper would not hear of our bundle (issue 27: announcements cross a
# returning helper within 30 s). Younger than the bundles a node keeps (4 rounds), so it can
# still be fetched.
REPUBLISH_WITHIN_S = 120.0


class Publisher:
    def __init__(self, topic: str, shards: ShardTopics, dialer: Dialer) -> None:
        self._topic, self._shards, self._dialer = topic, shards, dialer
        self.last_published: tuple[float, bytes] | None = None  # (trio clock, announcement)

    async def publish_each(self, pubsub, recv, interval_s: float) -> None:
        """Publish each queued announcement, paced (a round's publish and a restart's both come here)."""
        async for data in recv:
            # publish() drops silently once a peer's queue is full: wait while any is half full.
            deadline = trio.current_time() + PUBLISH_WAIT_S
            while trio.current_time() < deadline and any(
                len(q) >= 16 for q in list(pubsub.peer_queues.values())
            ):
                await trio.sleep(0.05)
            try:
                await pubsub.publish(self._shards.publish_topics(pubsub), data)
                self.last_published = (trio.current_time(), data)
            except Exception as exc:  # noqa: BLE001 — no peers, closing: the next round publishes again
                log.info("publish failed: %s", exc)
            await trio.sleep(interval_s)

    async def republish_to_returning_targets(self, pubsub) -> None:
        """Once a second: a dial target that joined our topic since the last look (a helper back
        after a restart, a bootstrap node) gets our latest announcement again, when it is young
        (REPUBLISH_WITHIN_S). Peers that had it ignore the copy (a duplicate, not blamed)."""
        listening: set[str] = set()
        while True:
            await trio.sleep(1.0)
            now = {p.to_base58() for name, peers in list(pubsub.peer_topics.items())
                   if name == self._topic or name.startswith(self._topic + "/") for p in peers}
            now = {p for p in now if self._dialer.is_target(p)}
            returned, listening = now - listening, now
            last = self.last_published
            if returned and last is not None and trio.current_time() - last[0] < REPUBLISH_WITHIN_S:
                try:
                    await pubsub.publish(self._shards.publish_topics(pubsub), last[1])
                except Exception as exc:  # noqa: BLE001 — as a round's publish: the next round publishes again
                    log.info("publish failed: %s", exc)

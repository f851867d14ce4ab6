"""Which connections the node keeps: room for peers with a good record, none for silent ones.

py-libp2p refuses connections beyond `max_connections`, and its own pruner never closes one with a
stream open — which every pubsub peer has. So 45 connections that never say anything used to fill
a node for good. Here, once a second:
- a peer that has not joined our gossip topic SILENT_AFTER_S after connecting is disconnected
  (an honest node subscribes within a heartbeat);
- above KEEP_AT_MOST connected peers, the least valuable are disconnected down to
  KEEP_AT_MOST - ROOM, so a newcomer always finds room to connect. Never disconnected: the peers
  we dial (bootstrap, static, remembered) and proven peers (a positive delivered record). The
  others are ranked by having announced anything, then their record, then age (older first);
- a peer disconnected here is disconnected again as soon as it returns within BANNED_S.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from libp2p.peer.id import ID

log = logging.getLogger("swarmling.swarm")

SILENT_AFTER_S = 15.0
KEEP_AT_MOST = 48
ROOM = 8
BANNED_S = 60.0
CHECK_INTERVAL_S = 1.0
DISCONNECT_TIMEOUT_S = 2.0

Rank = Callable[[str], tuple[bool, float]]  # peer -> (announced anything, delivered score)


class ConnectionKeeper:
    def __init__(self, protected: Callable[[str], bool], rank: Rank) -> None:
        self._protected = protected
        self._rank = rank
        self._first_seen: dict[str, float] = {}  # connected peer -> when we first saw it connected
        self._banned: dict[str, float] = {}  # peer -> until when it is disconnected on sight
        self.reaped = 0

    def to_close(self, connected: set[str], subscribed: set[str], now: float) -> list[str]:
        """The peers to disconnect now, given who is connected and who joined our topic."""
        self._first_seen = {p: self._first_seen.get(p, now) for p in connected}
        self._banned = {p: t for p, t in self._banned.items() if t > now}
        free = [p for p in connected if not self._protected(p)]
        close = {p for p in free if p in self._banned}
        close |= {p for p in free if p not in subscribed and now - self._first_seen[p] >= SILENT_AFTER_S}
        excess = len(connected) - len(close) - KEEP_AT_MOST
        if excess > 0:
            ranked = sorted((p for p in free if p not in close),
                            key=lambda p: (*self._rank(p), -self._first_seen[p]))
            close |= set(ranked[: excess + ROOM])
        for peer in close:
            self._banned[peer] = now + BANNED_S
        return sorted(close)

    async def run(self, host, pubsub, topic: str) -> None:
        """Apply `to_close` once a second, forever."""
        while True:
            await trio.sleep(CHECK_INTERVAL_S)
            connected = {p.to_base58() for p in host.get_connected_peers()}
            subscribed = {p.to_base58() for p in pubsub.peer_topics.get(topic, ())}
            for peer in self.to_close(connected, subscribed, trio.current_time()):
                self.reaped += 1
                log.debug("disconnecting %s (silent, or the least useful while connections run short)", peer[:16])
                with trio.move_on_after(DISCONNECT_TIMEOUT_S):
                    try:
                        await host.disconnect(ID.from_base58(peer))
                    except Exception as exc:  # noqa: BLE001 — already gone
                        log.debug("disconnecting %s: %s", peer[:16], exc)

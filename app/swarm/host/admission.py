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
- a peer disconnected here is disconnected again as soon as it returns within BANNED_S;
- every PING_EVERY_S each connected peer is pinged (libp2p's ping protocol): one that fails
  PING_FAILURES_TO_DROP times in a row is gone (powered off, NAT mapping dropped: TCP without
  keepalive never notices) and disconnected, so dead peers do not hold connection or mesh slots.

`free_inbound_slots_on_close` fixes what the fuzzer found under all this: py-libp2p 0.8.1 held
every inbound connection's slot until the host stopped, so a node refused everyone after its
96th inbound connection *ever* (honest churn included).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import trio
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID

log = logging.getLogger("swarmling.swarm")

SILENT_AFTER_S = 15.0
KEEP_AT_MOST = 48
ROOM = 8
BANNED_S = 60.0
CHECK_INTERVAL_S = 1.0
DISCONNECT_TIMEOUT_S = 2.0
INBOUND_POLL_S = 1.0
PING_EVERY_S = 30.0
PING_TIMEOUT_S = 10.0
PING_FAILURES_TO_DROP = 2
PINGS_AT_ONCE = 8

Rank = Callable[[str], tuple[bool, float]]  # peer -> (announced anything, delivered score)


class ConnectionKeeper:
    def __init__(self, protected: Callable[[str], bool], rank: Rank, keep_at_most: int = KEEP_AT_MOST) -> None:
        self._protected = protected
        self._keep_at_most = keep_at_most
        self._rank = rank
        self._first_seen: dict[str, float] = {}  # connected peer -> when we first saw it connected
        self._banned: dict[str, float] = {}  # peer -> until when it is disconnected on sight
        self._unanswered: dict[str, int] = {}  # connected peer -> pings failed in a row
        self.reaped = 0

    def to_close(self, connected: set[str], subscribed: set[str], now: float) -> list[str]:
        """The peers to disconnect now, given who is connected and who joined our topic."""
        self._first_seen = {p: self._first_seen.get(p, now) for p in connected}
        self._banned = {p: t for p, t in self._banned.items() if t > now}
        free = [p for p in connected if not self._protected(p)]
        close = {p for p in free if p in self._banned}
        close |= {p for p in free if p not in subscribed and now - self._first_seen[p] >= SILENT_AFTER_S}
        excess = len(connected) - len(close) - self._keep_at_most
        if excess > 0:
            ranked = sorted((p for p in free if p not in close),
                            key=lambda p: (*self._rank(p), -self._first_seen[p]))
            close |= set(ranked[: excess + ROOM])
        for peer in close:
            self._banned[peer] = now + BANNED_S
        return sorted(close)

    async def run(self, host, pubsub, topic: str) -> None:
        """Apply `to_close` once a second and ping every peer every PING_EVERY_S, forever."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ping_forever, host)
            while True:
                await trio.sleep(CHECK_INTERVAL_S)
                connected = {p.to_base58() for p in host.get_connected_peers()}
                # our swarm's announcement topic or any of its shards' (shards.py)
                subscribed = {p.to_base58() for name, peers in list(pubsub.peer_topics.items())
                              if name == topic or name.startswith(topic + "/") for p in peers}
                for peer in self.to_close(connected, subscribed, trio.current_time()):
                    log.debug("disconnecting %s (silent, or the least useful while connections run short)", peer[:16])
                    await self._disconnect(host, peer)

    async def _ping_forever(self, host) -> None:
        limit = trio.CapacityLimiter(PINGS_AT_ONCE)
        while True:
            await trio.sleep(PING_EVERY_S)
            connected = [p.to_base58() for p in host.get_connected_peers()]
            self._unanswered = {p: n for p, n in self._unanswered.items() if p in connected}
            async with trio.open_nursery() as nursery:
                for peer in connected:
                    nursery.start_soon(self._ping, host, peer, limit)

    async def _ping(self, host, peer: str, limit: trio.CapacityLimiter) -> None:
        async with limit:
            answered = False
            with trio.move_on_after(PING_TIMEOUT_S):
                try:
                    stream = await host.new_stream(ID.from_base58(peer), [PING_PROTOCOL])
                    try:
                        payload = os.urandom(32)
                        await stream.write(payload)
                        echo = b""
                        while len(echo) < len(payload):
                            chunk = await stream.read(len(payload) - len(echo))
                            if not chunk:
                                break
                            echo += chunk
                        answered = echo == payload
                    finally:
                        await stream.reset()
                except Exception as exc:  # noqa: BLE001 — no stream, reset: not answered
                    log.debug("ping %s: %s", peer[:16], exc)
        self._unanswered[peer] = 0 if answered else self._unanswered.get(peer, 0) + 1
        if self._unanswered[peer] >= PING_FAILURES_TO_DROP:
            log.debug("disconnecting %s: %d pings unanswered", peer[:16], self._unanswered.pop(peer))
            await self._disconnect(host, peer)

    async def _disconnect(self, host, peer: str) -> None:
        self.reaped += 1
        with trio.move_on_after(DISCONNECT_TIMEOUT_S):
            try:
                await host.disconnect(ID.from_base58(peer))
            except Exception as exc:  # noqa: BLE001 — already gone
                log.debug("disconnecting %s: %s", peer[:16], exc)


def free_inbound_slots_on_close(network) -> None:
    """Hold an inbound connection's slot under py-libp2p's inbound cap only while it is open.

    py-libp2p 0.8.1's `Swarm._do_handle_inbound_connection` upgrades the connection, then awaits
    `self.manager.wait_finished()` — the end of the whole swarm — while `_handle_inbound_connection`
    holds one token of `_inbound_limiter` (max_connections - min_connections) around it: tokens
    are returned only when the host stops. Measured: a node refused every new connection after
    its 65th inbound connection in a row of connect-and-leave peers (the issue's "no new peer
    could connect" after ~45 attackers). Upstream issue we would file (libp2p/py-libp2p):
    "Swarm: inbound connection handler waits for the swarm to finish instead of the connection
    to close; the inbound limiter leaks a token per connection ever accepted, and a long-running
    host eventually rejects all inbound connections."

    Our handler (TCP only: the pre-multiplexed QUIC path and connection gating, which this node
    does not use, are left out) returns once the connection is closed.
    """

    async def handle_inbound(read_write_closer, maddr, failure_event) -> None:
        raw_conn = RawConnection(read_write_closer, False)
        try:
            muxed = await network.upgrade_inbound_raw_conn(raw_conn, maddr)
        except Exception as exc:  # noqa: BLE001 — a failed handshake: hang up
            log.debug("inbound connection from %s failed: %s", maddr, exc)
            try:
                await raw_conn.close()
            except Exception:  # noqa: BLE001 — already gone
                pass
            return
        while not muxed.is_closed:
            await trio.sleep(INBOUND_POLL_S)

    network._do_handle_inbound_connection = handle_inbound

"""Whom a node keeps connected and which addresses it keeps for them (pure logic, no network)."""

from __future__ import annotations

import multiaddr
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from swarmling.app.swarm.host.admission import BANNED_S, KEEP_AT_MOST, ROOM, SILENT_AFTER_S, ConnectionKeeper
from swarmling.app.swarm.p2p.peerstore import DialablePeerstore


def keeper(protected=(), announced=(), scores=None) -> ConnectionKeeper:
    scores = scores or {}
    return ConnectionKeeper(lambda p: p in protected, lambda p: (p in announced, scores.get(p, 0.0)))


def test_peers_that_never_join_the_topic_are_disconnected_after_a_grace_and_kept_out_a_while():
    k = keeper(protected={"bootstrap"})
    connected = {"silent", "honest", "bootstrap"}
    assert k.to_close(connected, {"honest"}, now=0.0) == []
    assert k.to_close(connected, {"honest"}, now=SILENT_AFTER_S) == ["silent"]  # the bootstrap node is ours to keep
    back = SILENT_AFTER_S + 5
    assert k.to_close({"silent", "honest"}, {"honest", "silent"}, now=back) == ["silent"]  # back too soon: again
    assert k.to_close({"silent", "honest"}, {"honest", "silent"}, now=back + BANNED_S + 1) == []


def test_over_the_limit_the_least_useful_go_and_room_is_left_for_newcomers():
    crowd = {f"p{i}" for i in range(KEEP_AT_MOST + 10)}
    proven, announcer = "p1", "p2"
    k = keeper(protected={proven}, announced={announcer})
    closed = k.to_close(crowd, subscribed=crowd, now=0.0)
    assert len(crowd) - len(closed) == KEEP_AT_MOST - ROOM
    assert proven not in closed and announcer not in closed


def test_identify_cannot_replace_the_address_we_dialled_with_a_wildcard():
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    store = DialablePeerstore(loopback_ok=False)
    dialled = multiaddr.Multiaddr("/ip4/203.0.113.7/tcp/38433")
    store.pin(peer, dialled)
    # what identify does with a peer's advertised listen addresses: replace, then add (2 h)
    store.clear_addrs(peer)
    for addr in ("/ip4/0.0.0.0/tcp/38433", "/ip6/::/tcp/38433", "/ip4/127.0.0.1/tcp/38433", "/ip4/192.168.1.9/tcp/38433"):
        store.add_addr(peer, multiaddr.Multiaddr(addr), 7200)
    assert [str(a) for a in store.addrs(peer)] == ["/ip4/203.0.113.7/tcp/38433", "/ip4/192.168.1.9/tcp/38433"]


def test_a_node_on_loopback_keeps_loopback_addresses():
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    store = DialablePeerstore(loopback_ok=True)
    store.add_addrs(peer, [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/4001"), multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/4001")], 60)
    assert [str(a) for a in store.addrs(peer)] == ["/ip4/127.0.0.1/tcp/4001"]

"""The swarm survives any peer: hostile messages, streams and connections, restarts, NAT quirks.

Each test reproduces an attack or failure seen against a running node (issue 13), over real
libp2p on 127.0.0.1, and checks the node is still on the network afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from swarm_peers import Hostile, bundle_and_announcement, connected_pair, honest, meshed, real_groups
from waiting import wait_until

from swarmling.app.swarm import pubsub_guard

SHA256_PEER_ID = b"\x12\x20" + bytes(range(32))  # an RSA-style peer id: no key inside


def poison_rpc(topic: str) -> bytes:
    """The message that stopped py-libp2p 0.8.1's Pubsub service: its `key` does not parse."""
    msg = rpc_pb2.Message(from_id=SHA256_PEER_ID, data=b"x", seqno=b"\0" * 8, topicIDs=[topic],
                          signature=b"\1" * 64, key=b"\xff" * 4)
    return rpc_pb2.RPC(publish=[msg]).SerializeToString()


def still_on_the_network(tmp_path, b, name: str) -> None:
    """A new honest peer connects to b, and b hears its announcement."""
    c = honest(tmp_path, name, dial=(b.listen_addrs[0],))
    try:
        assert wait_until(lambda: b.peer_id in c.host.connected_peers(), timeout_s=20)
        assert wait_until(lambda: meshed(c.host, b.peer_id), timeout_s=20)
        c.host.publish(bundle_and_announcement(c.peer_id, real_groups(1))[1])
        assert wait_until(lambda: any(x.origin == c.peer_id for x in b.board.fresh()), timeout_s=20)
    finally:
        c.stop()


def test_a_message_whose_key_does_not_parse_is_dropped_and_the_host_stays_up(tmp_path):
    b, h = connected_pair(tmp_path)
    try:
        h.send_rpc(b.peer_id, poison_rpc(b.host.settings.topic))
        assert wait_until(lambda: b.host._pubsub.dropped_malformed >= 1, timeout_s=5)
        still_on_the_network(tmp_path, b, "c")
        assert b.host.health().restarts == 0 and b.host.health().running  # guarded: not even a restart
    finally:
        h.stop()
        b.stop()


def test_a_failing_libp2p_service_restarts_the_host_on_the_same_port(tmp_path, monkeypatch):
    # Without the guard, the poison message stops py-libp2p's Pubsub service: the supervisor
    # restarts the whole host, on the port peers know, and says why.
    monkeypatch.setattr(pubsub_guard.GuardedPubsub, "push_msg", Pubsub.push_msg)
    b, h = connected_pair(tmp_path)
    try:
        port = b.listen_addrs[0]
        h.send_rpc(b.peer_id, poison_rpc(b.host.settings.topic))
        assert wait_until(lambda: b.host.health().restarts == 1, timeout_s=10)
        health = b.host.health()
        assert "DecodeError" in health.last_error and health.last_error_at is not None
        assert wait_until(lambda: b.host.health().running, timeout_s=10)
        assert b.listen_addrs[0] == port
        assert wait_until(lambda: h.connected_peers(), timeout_s=30)  # h's dialler finds b again
        still_on_the_network(tmp_path, b, "c")
    finally:
        h.stop()
        b.stop()

"""Fuzzing everything a peer can send a node, against a real host on 127.0.0.1.

Property-based (hypothesis, derandomized so CI runs the same cases every time): gossip RPC frames
(every protobuf field: ids, keys, signatures, seqnos, topics, subscriptions, control messages,
signed peer records, and broken framing), announcements signed as a real peer would sign them,
bundle requests, and bundle replies the node fetches. After each case the node must still:
run its host (no failure, no restart), serve a bundle to a peer, answer the round loop's calls at
once; and its memory must stay bounded over the module.

Counts: FUZZ_EXAMPLES per property (SWARMLING_FUZZ_EXAMPLES overrides it, e.g. 500 for a long
hunt). Every input that ever broke the node is kept below as an `@example`, with what it did.
"""

from __future__ import annotations

import os
import struct
import time

import msgspec
import numpy as np
import psutil
import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.utils.varint import encode_uvarint
from swarm_peers import Hostile, bundle_and_announcement, honest, ignores, meshed, on_network_thread, real_groups
from waiting import wait_until

from swarmling.app.swarm.host.host import GOSSIPSUB_PROTOCOL
from swarmling.app.swarm.verification.board import MAX_ORIGINS
from swarmling.app.swarm.verification.wire import digest

# Minutes of real hosts under attack: the full suite (CI) runs it, the fast tier does not.
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

FUZZ_EXAMPLES = int(os.environ.get("SWARMLING_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
TOPIC = "/swarmling/test/1/announce"
SHA256_PEER_ID = b"\x12\x20" + bytes(range(32))
RSS_GROWTH_LIMIT = 300 * 1024 * 1024


class Victim:
    """An honest node under attack, the attacker it faces, and a bundle it serves (liveness probe)."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.node = honest(tmp_path, "victim")
        self.probes = 0
        self._new_probe_bundle()
        self.attackers = 0
        self.attacker = self._new_attacker()
        self.rss_start = psutil.Process().memory_info().rss

    def _new_attacker(self) -> Hostile:
        self.attackers += 1
        h = Hostile(self.tmp_path, dial=(self.node.listen_addrs[0],), name=f"attacker{self.attackers}")
        h.start()
        assert wait_until(lambda: self.node.peer_id in h.connected_peers() and meshed(h, self.node.peer_id), timeout_s=30)
        return h

    def attacker_in_good_standing(self) -> Hostile:
        """The attacker, or a fresh one once the victim hung up on it or stopped listening to it
        (its score fell): what the victim should do, but later cases would then test nothing."""
        h = self.attacker
        victim = ID.from_base58(self.node.peer_id)
        if victim not in on_network_thread(h, h._host.get_connected_peers) or ignores(self.node.host, h.peer_id):
            self.replace_attacker()
        return self.attacker

    def attack(self, send) -> None:
        """`send(attacker)`; once more from a fresh attacker when the victim had already hung up on
        the last one (its reaction to the previous case, which we only see when sending)."""
        try:
            send(self.attacker_in_good_standing())
        except Exception:  # noqa: BLE001 — no connection to open a stream on
            self.replace_attacker()
            send(self.attacker)

    def replace_attacker(self) -> None:
        self.attacker.stop()
        self.attacker = self._new_attacker()

    def _new_probe_bundle(self) -> None:
        # A peer is served each bundle once (bundle_protocol.ServedOnce): every probe asks for a new one.
        self.probes += 1
        body, _ = bundle_and_announcement(self.node.peer_id, real_groups(1), round_no=self.probes,
                                          addrs=self.node.listen_addrs)
        self.probe_digest, self.probe_body = digest(body), body
        self.node._own[self.probe_digest] = body

    def probe_served(self) -> bool:
        """The attacker fetches a bundle the victim has not served it yet, and gets it whole."""
        self._new_probe_bundle()
        node = self.node
        request = f"{self.probe_digest}\n".encode()
        reply = self.attacker.send_raw(node.peer_id, node.host.settings.fetch_protocol, request, read_s=5)
        return reply == struct.pack(">I", len(self.probe_body)) + self.probe_body

    def assert_alive(self) -> None:
        node = self.node
        health = node.host.health()
        assert health.running and health.restarts == 0, health
        # the round loop's calls answer at once
        started = time.monotonic()
        node.plan_fetches(np.random.default_rng(0))
        node.round_stats()
        node.peer_views()
        assert time.monotonic() - started < 1.0
        # a peer can still fetch a bundle from it (a new one, if it hung up on this one)
        try:
            served = self.probe_served()
        except Exception:  # noqa: BLE001 — the attacker's connection is gone
            served = False
        if not served:
            self.replace_attacker()
            assert self.probe_served()
        assert len(node.board._heard) <= MAX_ORIGINS

    def stop(self) -> None:
        self.attacker.stop()
        self.node.stop()


@pytest.fixture(scope="module")
def victim(tmp_path_factory):
    v = Victim(tmp_path_factory.mktemp("fuzz"))
    yield v
    try:
        rss_growth = psutil.Process().memory_info().rss - v.rss_start
        assert rss_growth < RSS_GROWTH_LIMIT, f"RSS grew {rss_growth / 2**20:.0f} MiB over the fuzz module"
        gossip_check(v)
    finally:
        v.stop()


def gossip_check(v: Victim) -> None:
    """After everything: a fresh honest peer's announcement still reaches the victim."""
    c = honest(v.tmp_path, "late-honest", dial=(v.node.listen_addrs[0],))
    try:
        assert wait_until(lambda: meshed(c.host, v.node.peer_id), timeout_s=30), gossip_state(v, c)
        c.host.publish(bundle_and_announcement(c.peer_id, real_groups(1))[1])
        assert wait_until(lambda: any(x.origin == c.peer_id for x in v.node.board.fresh()), timeout_s=30)
    finally:
        c.stop()


def gossip_state(v: Victim, c) -> str:
    """What the victim's and the newcomer's routers hold, for a failure message."""

    def state(host) -> str:
        ps, topic = host._pubsub, host.settings.topic
        return (f"connected={len(host._host.get_connected_peers())} pubsub_peers={len(ps.peers)} "
                f"topic_peers={len(ps.peer_topics.get(topic, ()))} mesh={len(ps.router.mesh.get(topic, ()))} "
                f"faults={ps.library_faults} dropped={ps.dropped_malformed} "
                f"backoff={sum(len(b) for b in getattr(ps.router, 'back_off', {}).values())}")

    return (f"victim: {on_network_thread(v.node.host, lambda: state(v.node.host))}; "
            f"newcomer: {on_network_thread(c.host, lambda: state(c.host))}; "
            f"victim knows newcomer: {on_network_thread(v.node.host, lambda: ID.from_base58(c.peer_id) in v.node.host._pubsub.peers)}")


# ---- gossip RPC frames ------------------------------------------------------------------------------

def identity_id(key_bytes: bytes) -> bytes:
    """An identity-multihash peer id embedding `key_bytes` as its 'public key' (garbage or not)."""
    return b"\x00" + encode_uvarint(len(key_bytes)) + key_bytes


peer_ids = st.one_of(
    st.just(SHA256_PEER_ID),
    st.binary(max_size=80),
    st.binary(max_size=60).map(identity_id),
    st.binary(min_size=32, max_size=32).map(lambda k: identity_id(b"\x08\x01\x12\x20" + k)),  # a real Ed25519 shape
)
topics = st.one_of(st.just(TOPIC), st.text(max_size=64))
messages = st.builds(
    rpc_pb2.Message,
    from_id=peer_ids,
    data=st.binary(max_size=4096),
    seqno=st.binary(max_size=48),
    topicIDs=st.lists(topics, max_size=3),
    signature=st.binary(max_size=160),
    key=st.one_of(st.binary(max_size=80), st.just(b"\xff" * 4)),
)
message_ids = st.lists(st.binary(max_size=100), max_size=20)
controls = st.builds(
    rpc_pb2.ControlMessage,
    ihave=st.lists(st.builds(rpc_pb2.ControlIHave, topicID=topics, messageIDs=message_ids), max_size=4),
    iwant=st.lists(st.builds(rpc_pb2.ControlIWant, messageIDs=message_ids), max_size=4),
    graft=st.lists(st.builds(rpc_pb2.ControlGraft, topicID=topics), max_size=4),
    prune=st.lists(st.builds(rpc_pb2.ControlPrune, topicID=topics, backoff=st.integers(0, 2**64 - 1),
                             peers=st.lists(st.builds(rpc_pb2.PeerInfo, peerID=peer_ids,
                                                      signedPeerRecord=st.binary(max_size=200)), max_size=4)),
                   max_size=4),
    idontwant=st.lists(st.builds(rpc_pb2.ControlIDontWant, messageIDs=message_ids), max_size=4),
)
rpcs = st.builds(
    rpc_pb2.RPC,
    subscriptions=st.lists(st.builds(rpc_pb2.RPC.SubOpts, subscribe=st.booleans(), topicid=topics), max_size=5),
    publish=st.lists(messages, max_size=4),
    control=st.one_of(st.none(), controls),
    senderRecord=st.one_of(st.just(b""), st.binary(max_size=300)),
)


def _on_our_topic(msg: rpc_pb2.Message) -> rpc_pb2.Message:
    msg.topicIDs[:] = [TOPIC]
    return msg


def poison_message() -> rpc_pb2.RPC:
    msg = rpc_pb2.Message(from_id=SHA256_PEER_ID, data=b"x", seqno=b"\0" * 8, topicIDs=[TOPIC],
                          signature=b"\1" * 64, key=b"\xff" * 4)
    return rpc_pb2.RPC(publish=[msg])


@FUZZ
@given(rpc=rpcs)
def test_gossip_rpc_frames(victim, rpc):
    victim.attack(lambda h: h.send_rpc(victim.node.peer_id, rpc.SerializeToString()))
    victim.assert_alive()


@FUZZ
@given(published=st.lists(messages.map(_on_our_topic), min_size=1, max_size=3))
# Found before the fuzzer (issue 13), and again by this property in its first cases with the
# guard taken out: DecodeError out of py-libp2p's signature_validator stopped the Pubsub service
# and with it the host. Fixed: pubsub_guard.malformed drops such a message first.
@example(published=list(poison_message().publish))
def test_gossip_messages_on_our_topic(victim, published):
    # Every message reaches push_msg (a whole RPC with a bad signed peer record, or messages on
    # topics we do not follow, are dropped before it: the general property above covers those).
    rpc = rpc_pb2.RPC(publish=published)
    victim.attack(lambda h: h.send_rpc(victim.node.peer_id, rpc.SerializeToString()))
    victim.assert_alive()


@FUZZ
@given(frame=st.one_of(
    st.binary(max_size=2048),  # no framing at all
    st.tuples(st.integers(0, 2**63), st.binary(max_size=512)).map(lambda t: encode_uvarint(t[0]) + t[1]),  # lying length
    st.just(b"\xff" * 11),  # a varint that never ends
))
def test_gossip_stream_framing(victim, frame):
    victim.attack(lambda h: h.send_raw(victim.node.peer_id, GOSSIPSUB_PROTOCOL, frame, read_s=0.3))
    victim.assert_alive()


# ---- announcements, signed as a real peer signs them ------------------------------------------------

def signed_rpc(h: Hostile, data: bytes, seqno: int) -> bytes:
    """A publish RPC carrying `data`, signed by `h` exactly as py-libp2p signs its own."""
    msg = rpc_pb2.Message(data=data, topicIDs=[TOPIC], from_id=ID.from_base58(h.peer_id).to_bytes(),
                          seqno=seqno.to_bytes(8, "big"))
    msg.signature = h.key_pair.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    return rpc_pb2.RPC(publish=[msg]).SerializeToString()


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=300), st.binary(max_size=300))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                       st.dictionaries(st.text(max_size=20), inner, max_size=6)),
                      max_leaves=40)
ANNOUNCEMENT_FIELDS = ["version", "swarm", "node_id", "model", "round", "timestamp", "digest", "size", "addrs", "groups"]


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(ANNOUNCEMENT_FIELDS), values, max_size=10),
       seqno=st.integers(0, 2**64 - 1), raw=st.one_of(st.none(), st.binary(max_size=20_000)))
def test_signed_announcements(victim, fields, seqno, raw):
    data = raw if raw is not None else msgspec.msgpack.encode(fields)
    victim.attack(lambda h: h.send_rpc(victim.node.peer_id, signed_rpc(h, data, seqno)))
    victim.assert_alive()


# ---- bundle protocol: requests to the node, replies to its fetches ------------------------------------

@FUZZ
@given(request=st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(lambda t: (t + "\n").encode("utf-8", "surrogatepass")),
    st.just(b"0" * 64 + b"\n"), st.just(b"\n" * 100), st.just(b"a" * 4096),
))
def test_bundle_requests(victim, request):
    replies: list[bytes] = []
    victim.attack(lambda h: replies.append(h.send_raw(victim.node.peer_id, victim.node.host.settings.fetch_protocol,
                                                      request, read_s=0.5)))
    reply = replies[-1]
    assert reply in (b"", struct.pack(">I", 0)) or reply == struct.pack(">I", len(victim.probe_body)) + victim.probe_body
    victim.assert_alive()


class ServesBytes(Hostile):
    """Answers every bundle request with `reply` (whatever it is), then hangs up."""

    reply = b""

    async def _serve_stream(self, stream) -> None:
        try:
            with trio.move_on_after(2):
                await stream.read(100)
            await stream.write(self.reply)
        finally:
            await stream.reset()


@pytest.fixture(scope="module")
def server(victim):
    s = ServesBytes(victim.tmp_path, dial=(victim.node.listen_addrs[0],), name="server")
    s.start()
    assert wait_until(lambda: victim.node.peer_id in s.connected_peers(), timeout_s=30)
    yield s
    s.stop()


@FUZZ
@given(length=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 4096)), body=st.binary(max_size=8192),
       header_bytes=st.integers(0, 4), max_bytes=st.integers(1, 512 * 1024), matching=st.booleans())
def test_bundle_replies(victim, server, length, body, header_bytes, max_bytes, matching):
    node = victim.node
    server.reply = struct.pack(">I", length)[:header_bytes] + body if header_bytes < 4 else struct.pack(">I", length) + body
    wanted = digest(body) if matching else "f" * 64
    node._fetch_failures.clear()
    fetched = node._fetched
    assert node.host.fetch(server.peer_id, wanted, max_bytes, ())
    assert wait_until(lambda: node._fetch_failures or node._fetched > fetched, timeout_s=15, interval_s=0.05)
    victim.assert_alive()

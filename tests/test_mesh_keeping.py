"""swarm/host/mesh.py's two changes to py-libp2p's GossipSub, on a router with no network:
which mesh peers a crowded heartbeat prunes, and a GRAFT at a backoff's end (issue 41)."""

from __future__ import annotations

import time

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from swarmling.app.swarm.host.mesh import GRAFT_BACKOFF_SLACK_S, KeepingGossipSub
from swarmling.app.swarm.p2p.identity import new_identity

TOPIC = "/swarmling/test/1/announce"


def peer(tmp_path, name: str) -> ID:
    return ID.from_base58(new_identity(tmp_path / name).peer_id)


def router(keeps=frozenset(), delivered=None, heard=frozenset()) -> KeepingGossipSub:
    delivered = delivered or {}
    return KeepingGossipSub(keeps=lambda p: p in keeps, rank=lambda p: (p in heard, delivered.get(p, 0.0)),
                            protocols=["/meshsub/1.1.0"], degree=6, degree_low=4, degree_high=12, heartbeat_interval=1)


def test_a_crowd_of_new_identities_is_pruned_before_the_peers_this_node_keeps(tmp_path):
    friend, useful, old, *crowd = [peer(tmp_path, f"p{i}") for i in range(14)]
    r = router(keeps={friend.to_base58()}, delivered={useful.to_base58(): 3.0})
    now = time.monotonic()
    r._since = {p: now - 1 for p in [friend, useful, *crowd]} | {old: now - 300}  # old: 5 minutes
    r.mesh[TOPIC] = {friend, useful, old, *crowd}
    pruned = r._select_peers_for_pruning(TOPIC, 14 - 6)
    assert len(pruned) == 8 and not {friend, useful, old} & set(pruned)
    assert r._select_peers_for_pruning(TOPIC, 0) == []


def test_among_peers_of_about_the_same_age_those_that_announced_stay_and_the_rest_is_chance(tmp_path):
    quiet, talker, *others = [peer(tmp_path, f"q{i}") for i in range(4)]
    r = router(heard={talker.to_base58(), *(o.to_base58() for o in others)})
    now = time.monotonic()
    r._since = {quiet: now - 20, talker: now - 20, others[0]: now - 21, others[1]: now - 22}  # one bucket
    r.mesh[TOPIC] = {quiet, talker, *others}
    assert r._select_peers_for_pruning(TOPIC, 1) == [quiet]
    chosen = {r._select_peers_for_pruning(TOPIC, 2)[1] for _ in range(40)}
    assert len(chosen) >= 2  # the tie among those that announced is broken at random


def graft(r: KeepingGossipSub, sender: ID) -> list[ID]:
    """Deliver a GRAFT from `sender`; the peers the router answered with PRUNE."""
    pruned = []

    async def emit_prune(topic, to, do_px, is_unsubscribe):
        pruned.append(to)

    r.emit_prune = emit_prune
    trio.run(r.handle_graft, rpc_pb2.ControlGraft(topicID=TOPIC), sender)
    return pruned


def test_a_graft_in_a_backoffs_last_seconds_is_taken_and_one_earlier_refused(tmp_path):
    late, early = peer(tmp_path, "late"), peer(tmp_path, "early")
    r = router()
    r.mesh[TOPIC] = set()
    r.back_off[TOPIC] = {late: int(time.time()) + GRAFT_BACKOFF_SLACK_S - 1, early: int(time.time()) + 30}
    assert graft(r, late) == [] and late in r.mesh[TOPIC] and late not in r.back_off[TOPIC]
    assert graft(r, early) == [early] and early not in r.mesh[TOPIC] and early in r.back_off[TOPIC]


def test_a_graft_refused_for_another_reason_keeps_its_backoff(tmp_path):
    direct = peer(tmp_path, "direct")
    r = router()
    r.mesh[TOPIC] = set()
    r.direct_peers = {direct}  # the library refuses a direct peer's GRAFT after the backoff check
    until = int(time.time()) + 1
    r.back_off[TOPIC] = {direct: until}
    assert graft(r, direct) == [direct]
    assert r.back_off[TOPIC][direct] >= until


def test_another_peers_message_is_forwarded_within_the_budget_and_our_own_always(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from libp2p.pubsub.gossipsub import GossipSub

    from swarmling.app.swarm.host.forwarding import UploadBudget

    sent: list[ID] = []

    async def sends(self, msg_forwarder, pubsub_msg) -> None:  # py-libp2p's forwarding, recorded
        sent.append(msg_forwarder)

    monkeypatch.setattr(GossipSub, "publish", sends)
    me, other, friend, *mesh = [peer(tmp_path, f"f{i}") for i in range(7)]
    r = router(keeps={friend.to_base58()})
    now = [0.0]
    r.forwarding = UploadBudget(kib_s=1.0, clock=lambda: now[0])  # a 4 KiB burst, no time passes
    r.pubsub = SimpleNamespace(my_id=me)
    r.mesh[TOPIC] = set(mesh)  # 4 mesh peers: a ~1,000-byte message costs ~4,000 bytes to pass on

    def message(origin: ID, seqno: bytes) -> rpc_pb2.Message:
        return rpc_pb2.Message(from_id=origin.to_bytes(), data=b"x" * 980, seqno=seqno, topicIDs=[TOPIC])

    first, second, ours, kept = message(other, b"1"), message(other, b"2"), message(me, b"3"), message(friend, b"4")
    for forwarder, msg in ((other, first), (other, second), (me, ours), (other, kept)):
        trio.run(r.publish, forwarder, msg)
    assert sent == [other, me, other] and r.forwarding.withheld == 1  # the second, over budget
    # withheld from the push, still cached: IHAVE gossip advertises it and a neighbour may pull it
    assert r.mcache.get(second.from_id + second.seqno) == second  # py-libp2p's message id: from_id + seqno

    # ...pulled by IWANT only within the same budget: a pull is an upload too (no time has passed)
    pulled: list[list[str]] = []

    async def answers(self, iwant_msg, sender_peer_id) -> None:  # py-libp2p's reply, recorded
        pulled.append(list(iwant_msg.messageIDs))

    monkeypatch.setattr(GossipSub, "handle_iwant", answers)
    for msg in (ours, kept):
        r.mcache.put(msg)
    wire = {m.seqno: m.from_id + m.seqno for m in (second, ours, kept)}  # opaque bytes, as go and js peers send
    trio.run(r.handle_iwant, rpc_pb2.ControlIWant(messageIDs=list(wire.values())), mesh[0])
    assert pulled == [[wire[b"3"], wire[b"4"]]]  # ours and the kept origin's
    assert r.forwarding.withheld == 1 and r.forwarding.pulls_withheld == 1  # counted apart from the push's
    now[0] = 2.0  # two seconds' budget later: the withheld one may be pulled now
    trio.run(r.handle_iwant, rpc_pb2.ControlIWant(messageIDs=[wire[b"2"]]), mesh[0])
    assert pulled[-1] == [wire[b"2"]]
    # a neighbour over py-libp2p's IWANT rate is refused there (and penalised), spending no budget
    monkeypatch.undo()
    now[0], spent = 10.0, r.forwarding.spent_bytes  # budget enough for it
    r.iwant_request_limits[mesh[1]]["requests"] = [time.time()] * (int(r.max_iwant_requests_per_second) + 1)
    trio.run(r.handle_iwant, rpc_pb2.ControlIWant(messageIDs=[wire[b"2"]]), mesh[1])
    assert r.forwarding.spent_bytes == spent

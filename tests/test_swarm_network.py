"""Real libp2p hosts on 127.0.0.1: joining, announcing, fetching — and what hostile peers try.

An honest node here is the real `Swarm` (host, board, inbox); a hostile peer is a raw
`SwarmHost` that publishes and serves whatever the test makes it. Every wait is bounded.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from swarm_peers import Hostile, bundle_and_announcement, connected_now, connected_pair, honest, ignores, meshed, real_groups
from waiting import wait_until

from swarmling.app.learning.prompt import PromptFormat
from swarmling.app.swarm.host import bundle_protocol, dialer
from swarmling.app.swarm.verification.intake import IntakeContext
from swarmling.app.swarm.verification.wire import digest

SWARM = "test"


@pytest.fixture
def pair(tmp_path):
    """An honest node B, and a hostile peer H dialling it."""
    b, h = connected_pair(tmp_path)
    yield b, h
    h.stop()
    b.stop()


# ---- joining and exchanging -----------------------------------------------------------------------

def test_three_nodes_join_through_bootstrap_and_static_peers_and_fetch_bundles(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_protocol, "IDLE_CLOSE_S", 1.0)  # how long a connection made for fetches stays idle
    # the most it stays open then: idle, the next look at it, its closing, the dialer's next look at the peers
    closed_within = (bundle_protocol.IDLE_CLOSE_S + bundle_protocol.IDLE_CHECK_S + bundle_protocol.CLOSE_TIMEOUT_S
                     + dialer.LOOP_INTERVAL_S + 2.0)
    a = honest(tmp_path, "a")
    b = honest(tmp_path, "b", dial=(a.listen_addrs[0],))  # a is b's bootstrap
    c = honest(tmp_path, "c", dial=(b.listen_addrs[0],))  # b is c's static peer; c never dials a itself
    try:
        assert wait_until(lambda: len(b.host.connected_peers()) == 2)
        assert wait_until(lambda: meshed(a.host, b.peer_id) and meshed(b.host, c.peer_id))
        body, ann = bundle_and_announcement(a.peer_id, real_groups(), addrs=a.listen_addrs)
        a._own[digest(body)] = body
        a.host.publish(ann)
        # c hears a's announcement relayed through b, then fetches from a directly (its address travels)
        assert wait_until(lambda: any(h.origin == a.peer_id for h in c.board.fresh()))
        assert c.plan_fetches(np.random.default_rng(0)) == 1
        assert wait_until(lambda: c.inbox._queue.qsize() == 1)
        # the connection made for the fetch is closed again: connections stay bounded by whom c dials
        assert wait_until(lambda: not connected_now(c.host, a.peer_id) and a.peer_id not in c.host.connected_peers(),
                          timeout_s=closed_within)
        stats = c.round_stats()
        assert stats.bundles_fetched == 1 and stats.bytes_in > len(body)
        assert stats.announce_latency_s_p50 is not None
        # what a gave: counted by a from what it served, whole, to c; nothing served by c
        gave = a.round_stats()
        assert (gave.bundles_served, gave.bundles_served_day, gave.served_peers_day) == (1, 1, 1)
        assert gave.given == "your rollouts: fetched 1x by 1 peer in 24 h"
        assert stats.bundles_served == 0 and stats.given == ""
        assert c.plan_fetches(np.random.default_rng(0)) == 0  # never the same bundle twice
    finally:
        for s in (c, b, a):
            s.stop()
    # peers met are remembered for the next start
    assert b.peer_id in (tmp_path / "c" / "known_peers.json").read_text()


# ---- hostile announcements ---------------------------------------------------------------------

@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xff\x00garbage", "malformed"),
        (msgspec.msgpack.encode({"version": 1, "swarm": SWARM, "evil": True}), "malformed"),
        (msgspec.msgpack.encode([1, SWARM, "x" * 100_000]), "malformed"),
    ],
    ids=["bytes", "schema", "oversized"],
)
def test_malformed_announcements_are_refused_and_not_relayed(pair, tmp_path, payload, reason):
    b, h = pair
    c = honest(tmp_path, "c", dial=(b.listen_addrs[0],))  # hears only what b relays
    try:
        assert wait_until(lambda: c.host.connected_peers())
        assert wait_until(lambda: meshed(b.host, c.peer_id))
        # the path works: a valid announcement from h reaches c through b
        h.publish(bundle_and_announcement(h.peer_id, real_groups(1), round_no=1)[1])
        assert wait_until(lambda: c.board.received == 1)
        h.publish(payload)
        assert wait_until(lambda: b.board.refused.get(reason, 0) >= 1)
        # a second valid one after it, on the same path: had b relayed the payload, c would
        # have had it first (b queues what it relays to c in order)
        h.publish(bundle_and_announcement(h.peer_id, real_groups(1), round_no=2)[1])
        assert wait_until(lambda: c.board.received == 2)
        assert c.board.received == 2 and not c.board.refused  # b did not pass the payload on
    finally:
        c.stop()


def test_announcement_for_someone_else_is_refused(pair):
    b, h = pair
    _, ann = bundle_and_announcement(b.peer_id, real_groups())  # claims to be b's own
    h.publish(ann)
    assert wait_until(lambda: b.board.refused.get("node id is not the signer", 0) == 1)
    assert not b.board.fresh()


def test_a_flood_of_announcements_is_rate_limited_and_honest_peers_still_get_through(pair, tmp_path):
    b, h = pair
    for i in range(120):
        _, ann = bundle_and_announcement(h.peer_id, real_groups(1), round_no=i)
        h.publish(ann)
    # the bucket lets a burst of 5 through, then refuses; past 20 more (a flood, not a burst after
    # a gap) each refusal costs the forwarder score (P4) until its messages are ignored altogether
    assert wait_until(lambda: b.board.refused.get("flood", 0) >= 5)
    assert wait_until(lambda: ignores(b.host, h.peer_id))  # from now on nothing of h's is even validated
    assert b.board.received <= 6
    assert len([x for x in b.board.fresh() if x.origin == h.peer_id]) <= 4  # bounded per origin
    honest_peer = honest(tmp_path, "d", dial=(b.listen_addrs[0],))
    try:
        assert wait_until(lambda: honest_peer.host.connected_peers())
        assert wait_until(lambda: meshed(honest_peer.host, b.peer_id))
        body, ann = bundle_and_announcement(honest_peer.peer_id, real_groups(1))
        honest_peer.host.publish(ann)
        assert wait_until(lambda: any(x.origin == honest_peer.peer_id for x in b.board.fresh()))
    finally:
        honest_peer.stop()


# ---- hostile bundles -----------------------------------------------------------------------------

def _intake(backend) -> IntakeContext:
    return IntakeContext(PromptFormat(), 0.5, 24, backend.encode_prompt, backend.tokenize)


def test_wrong_question_and_replays_are_refused_after_fetching(pair, backend):
    b, h = pair
    groups = real_groups(2)
    liar = msgspec.structs.replace(groups[0], question_hash="0" * 32)  # a question that is not its spec's
    body, ann = bundle_and_announcement(h.peer_id, [liar, groups[1]], addrs=h.listen_addrs)
    h.bodies[digest(body)] = body
    h.publish(ann)
    assert wait_until(lambda: b.board.fresh())
    assert b.plan_fetches(np.random.default_rng(0)) == 1
    assert wait_until(lambda: b.inbox._queue.qsize() == 1)
    report = b.inbox.drain(_intake(backend))
    assert report.admitted == 1 and any("hash mismatch" in r for r in report.reasons)
    assert report.by_peer == {h.peer_id: 1} and report.admitted_by_peer == {h.peer_id: 1}
    # what the TUI's swarm tab shows of this peer: one group verified, one refused and held against it
    b.penalize(h.peer_id, report.by_peer[h.peer_id])
    b.record_intake(report.admitted_by_peer, [])
    view = next(v for v in b.peer_views() if v.peer_id == h.peer_id)
    assert (view.connected, view.received, view.used, view.rejected) == (True, 1, 0, 1)
    assert view.score < 0 and view.fetch_seconds is not None and view.fetch_seconds > 0

    # the same groups again, re-wrapped in a new bundle: replays, refused before any work
    body2, ann2 = bundle_and_announcement(h.peer_id, [groups[1]], round_no=2, addrs=h.listen_addrs)
    h.bodies[digest(body2)] = body2
    h.publish(ann2)
    assert wait_until(lambda: len(b.board.fresh()) == 2)
    assert b.plan_fetches(np.random.default_rng(0)) == 1
    assert wait_until(lambda: b.inbox._queue.qsize() == 1)
    report = b.inbox.drain(_intake(backend))
    assert report.admitted == 0 and report.reasons == [f"{h.peer_id[:16]}: replay"]


def test_a_bundle_that_is_not_the_announced_one_costs_the_peer(pair):
    b, h = pair
    body, ann = bundle_and_announcement(h.peer_id, real_groups(), addrs=h.listen_addrs)
    h.bodies[digest(body)] = body[:-1] + bytes([body[-1] ^ 1])  # served bytes differ from the digest
    h.publish(ann)
    assert wait_until(lambda: b.board.fresh())
    b.plan_fetches(np.random.default_rng(0))
    assert wait_until(lambda: (s := b.reputation.standing(h.peer_id)) is not None and s.refused == 1)
    assert b.inbox._queue.qsize() == 0
    assert "does not match" in b.round_stats().fetch_failures[0]


@pytest.mark.parametrize(
    "behaviour, failure",
    [("lies about the size", "over the"), ("disconnects mid-transfer", "fetch failed"), ("never answers", "timed out")],
)
def test_a_peer_that_breaks_off_a_transfer_is_survived(tmp_path, behaviour, failure):
    b = honest(tmp_path, "b", fetch_timeout_s=2.0)
    h = Hostile(tmp_path, dial=(b.listen_addrs[0],), misbehave=behaviour)
    h.start()
    try:
        assert wait_until(lambda: b.host.connected_peers())
        assert wait_until(lambda: meshed(h, b.peer_id))
        body, ann = bundle_and_announcement(h.peer_id, real_groups(), addrs=h.listen_addrs)
        h.bodies[digest(body)] = body
        h.publish(ann)
        assert wait_until(lambda: b.board.fresh())
        b.plan_fetches(np.random.default_rng(0))
        failures: list[str] = []
        assert wait_until(lambda: failures.extend(b.round_stats().fetch_failures) or failures, timeout_s=10)
        assert failure in failures[0]
        assert b.inbox._queue.qsize() == 0
        # and the node still works: an honest peer's bundle arrives afterwards
        c = honest(tmp_path, "c", dial=(b.listen_addrs[0],))
        try:
            assert wait_until(lambda: b.peer_id in c.host.connected_peers())
            assert wait_until(lambda: meshed(c.host, b.peer_id))
            body, ann = bundle_and_announcement(c.peer_id, real_groups(1), addrs=c.listen_addrs)
            c._own[digest(body)] = body
            c.host.publish(ann)
            assert wait_until(lambda: any(x.origin == c.peer_id for x in b.board.fresh()))
            b.plan_fetches(np.random.default_rng(1))
            assert wait_until(lambda: b.inbox._queue.qsize() == 1)
        finally:
            c.stop()
    finally:
        h.stop()
        b.stop()

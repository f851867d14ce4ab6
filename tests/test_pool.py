"""Peers' admitted groups: kept once, used once, and offered only while fresh."""

from __future__ import annotations

from fakes import group

from swarmling.app.swarm.verification.pool import MAX_AGE_ROUNDS, GroupPool


def test_only_fresh_groups_are_offered():
    pool, now = GroupPool(clock=lambda: 0.0), 10
    old, fresh = group([0, 1], "peerA"), group([1, 0], "peerB")
    old.received_round, fresh.received_round = now - MAX_AGE_ROUNDS - 1, now
    assert pool.add("old", old) is None and pool.add("fresh", fresh) is None
    assert pool.available(now) == [fresh]
    # the old group was offered up to MAX_AGE_ROUNDS rounds after it arrived, and not one more
    assert old in pool.available(old.received_round + MAX_AGE_ROUNDS)
    assert old not in pool.available(old.received_round + MAX_AGE_ROUNDS + 1)
    assert pool.add("old", old) == "replay"


def test_used_groups_leave_the_pool_and_stay_seen():
    pool = GroupPool(clock=lambda: 0.0)
    g = group([0, 1], "peerA")
    pool.add("k", g)
    pool.mark_used([g])
    assert pool.available() == [] and pool.seen("k")

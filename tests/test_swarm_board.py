"""Which announcements a node accepts, and which bundles its sampler fetches (pure logic)."""

from __future__ import annotations

import numpy as np

from swarmling.app.swarm.verification.board import FLOOD_BURST, NEWCOMER_BUNDLES, Board, Verdict
from swarmling.app.swarm.verification.reputation import Reputation
from swarmling.app.swarm.verification.wire import PROTOCOL_VERSION, AnnouncedGroup, Announcement, WireSpec, encode_announcement

SPEC = WireSpec("starter", "basic_arithmetic", '{"x": 1}', 1, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def ann(peer: str, clock: Clock, *, round_no: int = 1, size: int = 1000, rewards=(0.5,), swarm="s", digest=None) -> bytes:
    digest = digest or f"{hash((peer, round_no)) % 16**64:064x}"
    groups = [AnnouncedGroup(SPEC, r) for r in rewards]
    return encode_announcement(Announcement(PROTOCOL_VERSION, swarm, peer, "m", round_no, clock.now, digest, size, [], groups))


B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer(i: int) -> str:
    return f"12D3KooWPeer{B58[i // 58]}{B58[i % 58]}"


def test_rate_limit_per_origin_refills_over_time():
    clock = Clock()
    board = Board("s", "me", rate_per_s=1.0, burst=2.0, clock=clock)
    assert [board.offer(peer(0), ann(peer(0), clock, round_no=r)) for r in range(4)] == [
        Verdict.ACCEPT, Verdict.ACCEPT, Verdict.IGNORE, Verdict.IGNORE]  # the forwarder is not blamed
    assert board.offer(peer(1), ann(peer(1), clock)), "one origin's flood does not block another"
    clock.now += 1.0
    assert board.offer(peer(0), ann(peer(0), clock, round_no=9))
    assert board.refused == {"rate limit": 2}


def test_a_burst_is_ignored_and_a_flood_rejected():
    clock = Clock()
    board = Board("s", "me", rate_per_s=1.0, burst=2.0, clock=clock)
    verdicts = [board.offer(peer(0), ann(peer(0), clock, round_no=r)) for r in range(2 + FLOOD_BURST + 3)]
    assert verdicts == [Verdict.ACCEPT] * 2 + [Verdict.IGNORE] * FLOOD_BURST + [Verdict.REJECT] * 3
    assert board.refused == {"rate limit": FLOOD_BURST, "flood": 3}


def test_refusals_name_their_reason():
    clock = Clock()
    board = Board("s", "me", clock=clock)
    # what an honest forwarder refuses too is rejected (counted against it) ...
    assert board.offer(peer(0), ann(peer(1), clock)) is Verdict.REJECT
    assert board.offer(peer(2), ann(peer(2), clock, swarm="other")) is Verdict.REJECT
    assert board.offer(peer(4), b"\x93junk") is Verdict.REJECT
    # ... what it may rightly have let through (its clock, an earlier copy it never saw) is ignored
    old = Clock()
    old.now -= 3600
    assert board.offer(peer(3), ann(peer(3), old)) is Verdict.IGNORE
    assert board.offer(peer(5), ann(peer(5), clock, digest="a" * 64))
    assert board.offer(peer(5), ann(peer(5), clock, round_no=2, digest="a" * 64)) is Verdict.IGNORE
    assert board.refused == {"node id is not the signer": 1, "another swarm": 1, "stale or from the future": 1,
                             "malformed": 1, "duplicate": 1}


def test_a_replayed_old_announcement_costs_only_the_check():
    # issue 27: honest announcements captured and replayed verbatim five minutes later (inside the
    # clock window, after GossipSub forgot their ids) were accepted and fetched again
    clock = Clock()
    board = Board("s", "me", clock=clock)
    captured = [ann(peer(0), clock, round_no=r) for r in range(1, 5)]
    for r, data in enumerate(captured, 1):
        assert board.offer(peer(0), data)
        clock.now += 60.0
    assert len(board.choose(10**9, np.random.default_rng(0))) == 1  # its newest, once
    for r in range(5, 10):  # the origin goes on announcing; its older ones leave the board
        assert board.offer(peer(0), ann(peer(0), clock, round_no=r))
        clock.now += 60.0
    assert [board.offer(peer(0), data) for data in captured] == [Verdict.IGNORE] * 4  # not relayed, not blamed
    assert board.refused == {"older than one heard": 4}
    assert {h.announcement.round for h in board.fresh()} == {6, 7, 8, 9}
    # a node that never heard the origin takes the replay, once: fetchers never ask twice (and the
    # author serves each peer a bundle once: bundle_protocol.ServedOnce)
    fresh = Board("s", "me", clock=clock)
    assert fresh.offer(peer(0), captured[-1]) and fresh.offer(peer(0), captured[-1]) is Verdict.IGNORE
    assert len(fresh.choose(10**9, np.random.default_rng(0))) == 1
    assert fresh.choose(10**9, np.random.default_rng(0)) == []


def test_choose_one_bundle_per_peer_within_budget_signal_first_never_twice():
    clock = Clock()
    board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
    for i in range(6):
        board.offer(peer(i), ann(peer(i), clock, round_no=1, size=1000, rewards=(0.5,) if i < 3 else (0.0,)))
        board.offer(peer(i), ann(peer(i), clock, round_no=2, size=1000, rewards=(0.5,) if i < 3 else (0.0,)))
    proven = lambda origin: 1.0  # noqa: E731 — every peer delivered before
    chosen = board.choose(3500, np.random.default_rng(0), score=proven)
    assert len(chosen) == 3  # 3 × 1000 bytes fit the budget, a 4th does not
    assert {h.origin for h in chosen} == {peer(0), peer(1), peer(2)}  # the ones with signal
    assert all(h.announcement.round == 2 for h in chosen)  # each peer's latest
    again = board.choose(10_000, np.random.default_rng(0), avoid=lambda o: o == peer(3), score=proven)
    assert {h.origin for h in again} == {peer(0), peer(1), peer(2), peer(4), peer(5)}  # round 1 ones and the rest
    assert not {h.announcement.digest for h in again} & {h.announcement.digest for h in chosen}


def test_inbound_budget_bounds_fetches_whatever_the_swarm_size():
    clock = Clock()
    for swarm_size in (8, 16, 64):
        board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
        for i in range(swarm_size):
            assert board.offer(peer(i), ann(peer(i), clock, size=4000))
        chosen = board.choose(20_000, np.random.default_rng(swarm_size), score=lambda origin: 2.0)
        assert sum(h.announcement.size for h in chosen) <= 20_000 and len(chosen) == 5


def test_newcomers_share_a_few_fetches_a_round_and_proven_peers_keep_theirs():
    clock = Clock()
    board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
    for i in range(40):
        board.offer(peer(i), ann(peer(i), clock, size=10_000))
    proven = {peer(0): 5.0, peer(1): 1.0}
    chosen = board.choose(200_000, np.random.default_rng(0), score=proven.get)
    origins = [h.origin for h in chosen]
    assert set(origins[:2]) == {peer(0), peer(1)}  # delivered before: fetched first
    assert len(origins) == 2 + NEWCOMER_BUNDLES  # however many newcomers announce bait
    # a budget the proven peers could fill alone still keeps a share for newcomers
    board2 = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
    for i in range(10):
        board2.offer(peer(i), ann(peer(i), clock, size=10_000))
    chosen = board2.choose(40_000, np.random.default_rng(0), score=lambda o: 1.0 if o in {peer(i) for i in range(8)} else None)
    assert sum(h.origin not in {peer(i) for i in range(8)} for h in chosen) == 1


def test_thirty_baiting_identities_do_not_starve_an_honest_peer():
    """The issue's starvation: 30 throw-away identities announce signal, then answer "missing".

    Before: they took every fetch, 0 honest groups in 27 rounds. Now each failure costs the baiter
    its standing and a cooldown; the honest peer is fetched within a few rounds, then every round."""
    clock = Clock()
    board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
    reputation = Reputation(clock=clock)
    honest_peer, baiters = peer(57), [peer(i) for i in range(30)]
    honest_rounds = []
    for round_no in range(1, 28):
        for origin in [*baiters, honest_peer]:
            board.offer(origin, ann(origin, clock, round_no=round_no, size=20_000, rewards=(0.5, 0.5)))
        chosen = board.choose(256 * 1024, np.random.default_rng(round_no), score=lambda o: (s := reputation.standing(o)) and s.score,
                              avoid=reputation.cooling_down)
        assert len([h for h in chosen if h.origin in baiters]) <= NEWCOMER_BUNDLES
        for h in chosen:
            if h.origin == honest_peer:
                reputation.fetch_succeeded(honest_peer, 0.1)
                reputation.admitted(honest_peer, 2)
                honest_rounds.append(round_no)
            else:
                reputation.fetch_failed(h.origin)  # "missing"
        clock.now += 60.0  # a round
    assert honest_rounds and honest_rounds[0] <= 11  # 30 baiters tried at most once before it, 3 a round
    assert honest_rounds == list(range(honest_rounds[0], 28))  # then every round


def test_failures_cool_a_peer_down_for_longer_each_time_and_success_resets_it():
    clock = Clock()
    reputation = Reputation(clock=clock)
    reputation.fetch_failed(peer(0))
    assert reputation.cooling_down(peer(0))
    clock.now += 31
    assert not reputation.cooling_down(peer(0))
    reputation.fetch_failed(peer(0))
    clock.now += 31
    assert reputation.cooling_down(peer(0))  # 60 s the second time
    reputation.fetch_succeeded(peer(0), 0.5)
    assert not reputation.cooling_down(peer(0))
    assert reputation.score(peer(0)) < 0 and not reputation.proven(peer(0))
    reputation.admitted(peer(0), 3)
    reputation.used(peer(0), 2)
    assert reputation.proven(peer(0))

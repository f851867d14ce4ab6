"""Which announcements a node accepts, and which bundles its sampler fetches (pure logic)."""

from __future__ import annotations

import numpy as np

from swarmling.app.swarm.board import Board
from swarmling.app.swarm.wire import PROTOCOL_VERSION, AnnouncedGroup, Announcement, WireSpec, encode_announcement

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
    assert [board.offer(peer(0), ann(peer(0), clock, round_no=r)) for r in range(4)] == [True, True, False, False]
    assert board.offer(peer(1), ann(peer(1), clock)), "one origin's flood does not block another"
    clock.now += 1.0
    assert board.offer(peer(0), ann(peer(0), clock, round_no=9))
    assert board.refused == {"rate limit": 2}


def test_refusals_name_their_reason():
    clock = Clock()
    board = Board("s", "me", clock=clock)
    assert not board.offer(peer(0), ann(peer(1), clock))
    assert not board.offer(peer(2), ann(peer(2), clock, swarm="other"))
    old = Clock()
    old.now -= 3600
    assert not board.offer(peer(3), ann(peer(3), old))
    assert not board.offer(peer(4), b"\x93junk")
    assert board.offer(peer(5), ann(peer(5), clock, digest="a" * 64))
    assert not board.offer(peer(5), ann(peer(5), clock, round_no=2, digest="a" * 64))
    assert board.refused == {"node id is not the signer": 1, "another swarm": 1, "stale or from the future": 1,
                             "malformed": 1, "duplicate": 1}


def test_choose_one_bundle_per_peer_within_budget_signal_first_never_twice():
    clock = Clock()
    board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
    for i in range(6):
        board.offer(peer(i), ann(peer(i), clock, round_no=1, size=1000, rewards=(0.5,) if i < 3 else (0.0,)))
        board.offer(peer(i), ann(peer(i), clock, round_no=2, size=1000, rewards=(0.5,) if i < 3 else (0.0,)))
    chosen = board.choose(3500, np.random.default_rng(0))
    assert len(chosen) == 3  # 3 × 1000 bytes fit the budget, a 4th does not
    assert {h.origin for h in chosen} == {peer(0), peer(1), peer(2)}  # the ones with signal
    assert all(h.announcement.round == 2 for h in chosen)  # each peer's latest
    again = board.choose(10_000, np.random.default_rng(0), avoid=lambda o: o == peer(3))
    assert {h.origin for h in again} == {peer(0), peer(1), peer(2), peer(4), peer(5)}  # round 1 ones and the rest
    assert not {h.announcement.digest for h in again} & {h.announcement.digest for h in chosen}


def test_inbound_budget_bounds_fetches_whatever_the_swarm_size():
    clock = Clock()
    for swarm_size in (8, 16, 64):
        board = Board("s", "me", rate_per_s=100, burst=100, clock=clock)
        for i in range(swarm_size):
            assert board.offer(peer(i), ann(peer(i), clock, size=4000))
        chosen = board.choose(20_000, np.random.default_rng(swarm_size))
        assert sum(h.announcement.size for h in chosen) <= 20_000 and len(chosen) == 5

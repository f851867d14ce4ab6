"""The training set: I local + J external groups with signal, capped per peer, gaps filled locally."""

from __future__ import annotations

import numpy as np
from fakes import group

from swarmling.app.learning.group_selection import select_groups
from swarmling.app.learning.rollout import ScoredCompletion


def test_selection_drops_zero_advantage_groups_and_caps():
    rng = np.random.default_rng(0)
    local = [group([0, 0, 0]), group([0, 1, 0]), group([1, 1, 1]), group([0.2, 0.0, 0.0])]
    sel = select_groups(local, [], local_groups=4, external_groups=0, rng=rng)
    assert len(sel.local) == 2 and all(g.has_signal for g in sel.local)
    sel = select_groups(local, [], local_groups=1, external_groups=0, rng=rng)
    assert len(sel.local) == 1
    external = [group([0, 1], "peerA") for _ in range(5)] + [group([1, 0], "peerB"), group([1, 1], "peerC")]
    sel = select_groups(local, external, 4, 4, rng, max_per_peer=2)
    sources = [g.source for g in sel.external]
    assert sources.count("peerA") <= 2 and "peerC" not in sources and len(sel.external) == 3


def test_missing_external_groups_are_filled_with_local_ones():
    rng = np.random.default_rng(1)
    local = [group([0, 1]) for _ in range(8)]
    alone = select_groups(local, [], local_groups=4, external_groups=4, rng=rng)
    assert (len(alone.local), len(alone.external)) == (8, 0)  # a lone node trains on I + J local groups
    one_peer = select_groups(local, [group([1, 0], "peerA") for _ in range(3)], 4, 4, rng, max_per_peer=2)
    assert (len(one_peer.local), len(one_peer.external)) == (6, 2)
    full = select_groups(local, [group([1, 0], p) for p in "ABCDEF"], 4, 4, rng, max_per_peer=2)
    assert (len(full.local), len(full.external)) == (4, 4)


def test_a_format_only_group_stops_being_trained_on_once_the_bonus_has_faded():
    """Every reply wrong; the tagged ones earn the format bonus, which fades as the tag rate rises."""
    rng = np.random.default_rng(2)

    def shaped(strict, tagged, bonus):
        g = group(strict)
        g.completions = [ScoredCompletion("x", [1], None, "eos", s, t, s + bonus * t) for s, t in zip(strict, tagged)]
        return g

    early = shaped([0, 0, 0, 0], [1, 0, 1, 0], 0.5)  # bonus 0.5 (tag rate ~0): the format is still worth learning
    late = shaped([0, 0, 0, 0], [1, 0, 1, 0], 0.005)  # bonus 0.005 (tag rate 99%)
    assert early.format_only and select_groups([early], [], 1, 0, rng).local == [early]
    assert select_groups([late], [], 1, 0, rng).local == []
    right_among_wrong = shaped([1, 0, 0, 0], [1, 1, 0, 1], 0.005)
    assert not right_among_wrong.format_only and select_groups([right_among_wrong], [], 1, 0, rng).local


def test_fill_keeps_every_own_group_with_signal_and_peers_take_only_the_places_left():
    """Late in a run most own groups have signal: the paper's mix gives J of them away to peers'
    groups, fill keeps them all and lets peers' groups take the places without signal, up to J."""
    rng = np.random.default_rng(3)
    peers = [group([1, 0], p) for p in "ABCDEF"]
    late = [group([0, 1]) for _ in range(7)] + [group([1, 1])]  # 7 of 8 own groups with signal
    mix = select_groups(late, peers, 4, 4, rng, max_per_peer=2)
    assert (len(mix.local), len(mix.external)) == (4, 4)
    fill = select_groups(late, peers, 4, 4, rng, max_per_peer=2, fill=True)
    assert (len(fill.local), len(fill.external)) == (7, 1)
    early = [group([0, 1]) for _ in range(2)] + [group([0, 0]) for _ in range(6)]  # 2 of 8
    assert [len(s) for s in (select_groups(early, peers, 4, 4, rng, 2, fill=True).local,
                             select_groups(early, peers, 4, 4, rng, 2, fill=True).external)] == [2, 4]
    alone = select_groups(late, [], 4, 4, rng, fill=True)
    assert (len(alone.local), len(alone.external)) == (7, 0)

"""Shard logic (app/swarm/verification/shards.py): pure functions, no network."""

from __future__ import annotations

import random

import pytest

from swarmling.app.swarm.verification import shards
from swarmling.app.swarm.verification.shards import (
    MAX_LEVEL,
    MERGE_BELOW,
    SPLIT_ABOVE,
    ShardLevel,
    estimate_size,
    hearing_level,
    home_topic,
    landing_level,
    parse_topic,
    publish_topics,
    shard_of,
    subscriptions,
    topic,
    wanted_level,
)

ROOT = "/swarmling/main/1/announce"


def ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    return ["12D3KooW" + "".join(rng.choice(alphabet) for _ in range(44)) for _ in range(n)]


def test_shards_nest_and_spread_evenly():
    peers = ids(4096)
    for p in peers[:200]:
        for level in range(1, MAX_LEVEL + 1):
            assert shard_of(p, level) % (1 << (level - 1)) == shard_of(p, level - 1)
    counts = [0] * 16
    for p in peers:
        counts[shard_of(p, 4)] += 1
    assert min(counts) > 256 * 0.7 and max(counts) < 256 * 1.3


def test_level_zero_is_the_one_topic_of_before_and_topics_parse_back():
    assert topic(ROOT, 0, 0) == ROOT
    assert topic(ROOT, 3, 5) == ROOT + "/8/5"
    assert parse_topic(ROOT, ROOT) == (0, 0)
    assert parse_topic(ROOT, ROOT + "/8/5") == (3, 5)
    for bad in (ROOT + "/8/8", ROOT + "/6/1", ROOT + "/1/0", ROOT + "/8", ROOT + "/8/5/1", ROOT + "x/8/5",
                "/swarmling/other/1/announce/8/5", ROOT + f"/{1 << (MAX_LEVEL + 1)}/0", ROOT + "/8/-1"):
        assert parse_topic(ROOT, bad) is None, bad


@pytest.mark.parametrize("n", [1, 2, 8, 16, 31, 32])
def test_a_small_swarm_stays_on_one_topic(n):
    assert landing_level(n) == 0
    assert wanted_level(n, 0) == 0
    me = ids(1)[0]
    assert publish_topics(ROOT, me, 0, None) == (ROOT,)
    assert subscriptions(ROOT, me, 0, None, ids(n, 1)) == (ROOT,)


@pytest.mark.parametrize("n", [33, 48, 64, 100, 1000, 10_000, 100_000])
def test_a_change_lands_inside_the_band_of_its_level(n):
    level = landing_level(n)
    assert 1 <= level <= MAX_LEVEL
    per_shard = n / (1 << level)
    assert MERGE_BELOW <= per_shard <= SPLIT_ABOVE or level == MAX_LEVEL
    assert wanted_level(n, level) == level  # no change right after landing


def test_the_estimate_counts_only_our_own_shard_and_scales_it():
    peers = ids(200, 2)
    me = peers[0]
    level = 2
    heard = peers[1:]
    same = sum(shard_of(p, level) == shard_of(me, level) for p in heard)
    assert estimate_size(me, level, heard) == (1 + same) * 4
    assert estimate_size(me, level, heard + heard + [me]) == (1 + same) * 4  # duplicates and ourselves
    assert estimate_size(me, 0, heard) == 200


def converge(level_of: ShardLevel, swarm: list[str], rounds: int, hear=lambda lvl, heard: heard) -> list[int]:
    """Feed `level_of` the announcers it would hear in its shard, round after round."""
    me = level_of.peer_id
    out = []
    for _ in range(rounds):
        lvl = level_of.level
        heard = [p for p in swarm if shard_of(p, lvl) == shard_of(me, lvl)]
        out.append(level_of.update(hear(lvl, heard)))
    return out


def test_a_growing_swarm_splits_after_confirmation_and_then_stays():
    swarm = ids(200, 3)
    node = ShardLevel(swarm[0])
    levels = converge(node, swarm, 20)
    assert levels[: shards.CONFIRM_ROUNDS - 1] == [0] * (shards.CONFIRM_ROUNDS - 1)
    final = levels[-1]
    assert final == landing_level(200) and set(levels[shards.CONFIRM_ROUNDS:]) == {final}
    assert node.changes == 1


def test_transition_keeps_the_old_topic_for_a_few_rounds():
    swarm = ids(200, 4)
    node = ShardLevel(swarm[0])
    converge(node, swarm, shards.CONFIRM_ROUNDS)
    assert node.level > 0 and node.previous == 0
    subs = subscriptions(ROOT, node.peer_id, node.level, node.previous, [])
    assert subs == (home_topic(ROOT, node.peer_id, node.level), ROOT)
    assert publish_topics(ROOT, node.peer_id, node.level, node.previous)[0] == ROOT
    converge(node, swarm, shards.TRANSITION_ROUNDS)
    assert node.previous is None


def test_a_noisy_estimate_around_a_threshold_does_not_oscillate():
    rng = random.Random(5)
    swarm = ids(40, 6)  # near SPLIT_ABOVE at level 0 and MERGE_BELOW·2 at level 1
    node = ShardLevel(swarm[0])

    def noisy(level, heard):  # lose up to half of what we should hear, at random
        return [p for p in heard if rng.random() > rng.random() * 0.5]

    levels = converge(node, swarm, 300, noisy)
    flips = sum(a != b for a, b in zip(levels, levels[1:]))
    assert flips <= 6, levels


def test_flapping_doubles_the_rounds_needed_to_change():
    swarm = ids(100, 7)
    node = ShardLevel(swarm[0])
    converge(node, swarm, shards.CONFIRM_ROUNDS + shards.TRANSITION_ROUNDS)
    assert node.level > 0
    # now it hears nobody for a while (a partition): it merges back, after confirmation …
    levels = converge(node, swarm, 40, lambda lvl, heard: [])
    first_merge = levels.index(0)
    assert first_merge == shards.CONFIRM_ROUNDS - 1
    # … and when it hears everyone again it splits again, but only after twice as many rounds
    levels = converge(node, swarm, 40)
    assert levels.index(node.level) == 2 * shards.CONFIRM_ROUNDS - 1


def test_a_newcomer_starts_at_its_neighbours_level():
    swarm = ids(2000, 8)
    node = ShardLevel(swarm[0])
    assert node.update([], neighbour_levels=[6, 6, 7, 5, 6]) == 6
    assert node.update([], neighbour_levels=[9, 9, 9]) == 6  # only the first time
    node = ShardLevel(swarm[1])
    assert node.update([], neighbour_levels=[0, 0]) == 0


def test_a_node_with_no_shard_neighbour_falls_back_to_a_coarser_topic():
    peers = ids(400, 9)
    me, others = peers[0], peers[1:]
    level = 4
    same = [p for p in others if shard_of(p, level) == shard_of(me, level)]
    half = [p for p in others if shard_of(p, 1) == shard_of(me, 1) and shard_of(p, 2) != shard_of(me, 2)]
    other_half = [p for p in others if shard_of(p, 1) != shard_of(me, 1)]
    assert subscriptions(ROOT, me, level, None, same[:3] + other_half) == (home_topic(ROOT, me, level),)
    assert subscriptions(ROOT, me, level, None, same[:1] + other_half, min_peers=1) == (home_topic(ROOT, me, level),)
    assert hearing_level(me, level, same[:2] + half[:3] + other_half) == 1  # two of our shard are too few
    assert hearing_level(me, level, half[:3] + other_half) == 1
    assert subscriptions(ROOT, me, level, None, half[:3]) == (home_topic(ROOT, me, level), home_topic(ROOT, me, 1))
    assert hearing_level(me, level, other_half) == 0
    assert subscriptions(ROOT, me, level, None, other_half)[-1] == ROOT
    assert hearing_level(me, level, []) == level  # nobody to fall back on


def test_a_node_dials_announcers_of_its_shard_until_it_has_enough_of_them():
    peers = ids(400, 11)
    me, others = peers[0], peers[1:]
    level = 3
    same = [p for p in others if shard_of(p, level) == shard_of(me, level)]
    other = [p for p in others if shard_of(p, level) != shard_of(me, level)]
    assert shards.shard_mates_to_dial(me, 0, [], others) == []  # one topic: no shards to meet
    assert shards.shard_mates_to_dial(me, level, other[:10], others) == same[:shards.SHARD_PEERS]
    assert shards.shard_mates_to_dial(me, level, same[:1] + other[:10], others) == same[1:shards.SHARD_PEERS]
    assert shards.shard_mates_to_dial(me, level, same[:shards.SHARD_PEERS], others) == []


def test_publishing_tags_the_chain_so_nodes_one_level_apart_hear_each_other():
    swarm = ids(300, 10)
    for a in swarm[:30]:
        for b in swarm[30:60]:
            for la in range(0, 6):
                for lb in (la, la + 1):
                    listened_b = {home_topic(ROOT, b, lb)}
                    tags_a = set(publish_topics(ROOT, a, la, None, listened_b.__contains__))
                    tags_b = set(publish_topics(ROOT, b, lb, None, {home_topic(ROOT, a, la)}.__contains__))
                    same_coarse = shard_of(a, la) == shard_of(b, la)
                    # the coarser node hears every node of its shard one level finer
                    assert (home_topic(ROOT, a, la) in tags_b) == same_coarse
                    # and the finer node hears the coarser one when they share the finer shard
                    if shard_of(a, lb) == shard_of(b, lb):
                        assert home_topic(ROOT, b, lb) in tags_a
                    elif lb > la:
                        assert home_topic(ROOT, b, lb) not in tags_a

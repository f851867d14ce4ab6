"""Sharded announcements on real hosts: network-only nodes (app/swarm_bench.py) with a tiny shard size.

Eight real SwarmNetworks on 127.0.0.1, in this process, with the shard thresholds scaled down so
that eight nodes split into shards of two or three: every node still hears someone every round,
hears only its shard (or the coarser topic it fell back to when no neighbour shares its shard),
and hears fewer announcements, for fewer bytes, than when all were on one topic.
"""

from __future__ import annotations

import time
from statistics import fmean

import pytest

from swarmling.app import swarm_bench
from swarmling.app.swarm import shards
from swarmling.app.swarm.shards import parse_topic, shard_of

N = 8
ROUND_S = 2.5


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shards, "SPLIT_ABOVE", 4)
    monkeypatch.setattr(shards, "MERGE_BELOW", 1)
    monkeypatch.setattr(shards, "LAND_AT_MOST", 3)
    monkeypatch.setattr(shards, "CONFIRM_ROUNDS", 1)
    monkeypatch.setattr(shards, "TRANSITION_ROUNDS", 1)
    monkeypatch.setattr(shards, "MIN_SHARD_NEIGHBOURS", 1)  # shards of two or three nodes
    monkeypatch.setattr(shards, "SHARD_PEERS", 1)


def test_sharded_nodes_hear_their_shard_only_and_always_someone(tmp_path, small_shards):
    opts = swarm_bench.BenchOptions((N,), groups=2, completions=2, chars=60, dial=3, round_s=ROUND_S)
    nodes = swarm_bench.make_nodes(swarm_bench.node_specs(N, opts, tmp_path), opts)
    ids = {n["net"].peer_id for n in nodes}
    try:
        for node in nodes:
            node["net"].start()
        time.sleep(2.5)  # connections and the gossip mesh
        rounds = []
        for r in range(1, 6):
            started = time.monotonic()
            swarm_bench.play_round(nodes, r, opts)
            time.sleep(max(0.0, ROUND_S - (time.monotonic() - started)))
            rounds.append([swarm_bench.node_stats(node) for node in nodes])
    finally:
        for node in nodes:
            node["net"].stop()
    root = nodes[0]["net"].host.settings.topic
    # round 1: one topic, everyone hears (nearly) everyone; round 2 decides 4 shards (8 nodes > 4 per shard)
    assert all(s["shards"] == 1 for s in rounds[0])
    one_topic = rounds[1]
    assert fmean(len(s["heard_from"]) for s in one_topic) >= 0.7 * (N - 1)
    sharded = rounds[3:]  # after the change and its one settling round
    for stats in sharded:
        for s in stats:
            me = nodes[s["node"]]["net"].peer_id
            assert s["shards"] == 4
            assert s["heard_from"], f"node {s['node']} heard nobody"
            allowed = set()
            for name in s["topics"]:
                level, shard = parse_topic(root, name)
                allowed |= {p for p in ids if p != me and shard_of(p, level) == shard}
            assert set(s["heard_from"]) <= allowed, (s["node"], s["topics"])
    heard_sharded = fmean(len(s["heard_from"]) for stats in sharded for s in stats)
    assert heard_sharded <= 0.6 * (N - 1)
    gossip = lambda s: s["bytes_in"] - s["bundle_bytes_in"]  # noqa: E731
    assert fmean(gossip(s) for stats in sharded for s in stats) < 0.75 * fmean(gossip(s) for s in one_topic)

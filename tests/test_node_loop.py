"""The node's loop on a backend without a model: rounds, checkpoints and resume, pause / resume /
stop from another thread, guest suspensions, and peers' bundles refused at intake.
(The same node on the real model, through the CLI: test_node.py.)"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
from fakes import NODE_CLI, SETTINGS, FakeBackend, make_node, records
from waiting import wait_until

from swarmling.app.config import ConfigError, load_config
from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.node.guest import Readings
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.round import run_round
from swarmling.app.swarm.verification.wire import bundle_from_groups, encode_bundle
from swarmling.app.learning.tasks import load_preset

PEER = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
def test_rounds_are_checkpointed_and_a_restart_resumes_after_the_last(tmp_path):
    node, built = make_node(tmp_path)
    try:
        assert node.run(2) == 2
    finally:
        node.close()
    assert built[0].closed and [r["round"] for r in records(tmp_path)] == [1, 2]
    assert all(r["model"] == "smollm2-135m" and r["backend"] == "fake" and r["rss_bytes"] > 0 for r in records(tmp_path))

    events = []
    node, built = make_node(tmp_path, events)
    try:
        node.start()
        assert node.round == 2 and built[0].train_steps == 2  # the backend's state came back too
        status = node.status()  # `swarmling status` before the first round after the restart
        assert status.round == 2 and status.last_round is not None and status.last_round.round == 2
        assert node.run(1) == 1
        assert node.status().round == 3 and node.status().last_round.round == 3
    finally:
        node.close()
    assert [r["round"] for r in records(tmp_path)] == [1, 2, 3]
    assert next(e for e in events if type(e).__name__ == "NodeStarted").resumed_round == 2


def test_pause_now_drops_the_round_in_flight_and_resume_goes_on(tmp_path):
    events = []
    node, _ = make_node(tmp_path, events, step_seconds=0.05)  # 16 completions: ~0.8 s of generation
    node.start()
    runner = threading.Thread(target=node.run, args=(2,), daemon=True)
    try:
        runner.start()
        assert wait_until(lambda: node.phase == "generate", 10)
        node.pause()
        assert wait_until(lambda: node.state == "paused", 10)
        assert node.round == 0 and any("dropped to pause" in getattr(e, "text", "") for e in events)
        node.resume()
        runner.join(30)
        assert not runner.is_alive() and node.round == 2
    finally:
        node.request_stop()
        node.close()


def test_pause_after_the_round_finishes_it_first(tmp_path):
    node, _ = make_node(tmp_path, step_seconds=0.02)
    node.start()
    runner = threading.Thread(target=node.run, daemon=True)
    try:
        runner.start()
        assert wait_until(lambda: node.phase == "generate", 10)
        node.pause(finish_round=True)
        assert wait_until(lambda: node.state == "paused", 10)
        assert node.round == 1 and node.paused
    finally:
        node.request_stop()
        runner.join(10)
        node.close()
    assert not runner.is_alive()


def test_stop_now_abandons_the_round_and_keeps_the_last_checkpoint(tmp_path):
    events = []
    node, _ = make_node(tmp_path, events, step_seconds=0.05)
    node.start()
    runner = threading.Thread(target=node.run, daemon=True)
    try:
        runner.start()
        assert wait_until(lambda: node.phase == "generate", 10)
        node.request_stop()
        runner.join(10)
    finally:
        node.close()
    assert not runner.is_alive() and node.round == 0
    assert any("abandoned; the node resumes after round 0" in getattr(e, "text", "") for e in events)


def test_a_long_suspension_releases_the_backend_and_resuming_rebuilds_it(tmp_path):
    events = []
    node, built = make_node(tmp_path, events, **{"resources.release_memory_after_s": 1})
    node.start()
    node.guest.check(Readings(now=datetime.now(), on_battery=True))
    runner = threading.Thread(target=node.run, args=(1,), daemon=True)
    try:
        runner.start()
        assert wait_until(lambda: built[0].closed, 10)  # released while suspended
        assert node.state == "suspended" and node.round == 0
        node.guest.check(Readings(now=datetime.now(), on_battery=False))
        runner.join(30)
        assert not runner.is_alive() and node.round == 1 and len(built) == 2 and not built[1].closed
        assert any("released the model's memory" in getattr(e, "text", "") for e in events)
    finally:
        node.request_stop()
        node.close()


def test_peers_bundles_are_verified_at_intake_with_the_swarm_off(tmp_path):
    preset = load_preset("starter-2")  # the node's default preset
    theirs = run_round(1, FakeBackend(), preset, Curriculum(preset), SETTINGS, RoundDraws(1, 1))
    data = encode_bundle(bundle_from_groups(theirs.groups, swarm="test", node_id=PEER, model="smollm2-135m",
                                            round_no=1, timestamp=1.0, prefill="<answer>"))
    events = []
    # the paper's mix: with fill, this node's own groups (all with signal here) would leave no place
    node, _ = make_node(tmp_path, events, **{"round.peer_groups": "mix"})
    try:
        node.start()
        assert node.swarm.inbox.offer(PEER, data)
        assert node.swarm.inbox.offer(PEER, b"\x00garbage")
        assert node.swarm.inbox.offer("12D3KooWSomeoneElse", data)
        assert node.run(1) == 1
    finally:
        node.close()
    record = records(tmp_path)[0]
    assert record["external_available"] >= 1 and record["external_rejected"] >= 2
    # provenance: who taught this node what
    assert record["external_groups"] >= 1 and record["external_groups_by_peer"] == {PEER: record["external_groups"]}
    assert record["external_age_rounds_mean"] == 0  # admitted in the round that trained on them
    assert 0 <= record["format_only_share"] <= 1
    assert 0 < record["external_advantage_share"] < 1  # peers taught part of this round's update
    warnings = [e.text for e in events if type(e).__name__ == "Notice"]
    assert any("not a zlib stream" in w for w in warnings) and any("claims to come from" in w for w in warnings)


def test_the_node_refuses_a_config_whose_round_its_memory_ceiling_cannot_hold(tmp_path):
    node, _ = make_node(tmp_path)
    try:
        node.start()
        on_cpu = [*NODE_CLI, ("backend.kind", "cpu")]  # whatever this machine has: the CPU backend's rule
        node.check_config(load_config(None, environ={}, cli=[*on_cpu, ("resources.max_memory_gb", 3.0)]))
        with pytest.raises(ConfigError, match="round.questions"):
            node.check_config(load_config(None, environ={}, cli=[
                *on_cpu, ("resources.max_memory_gb", 2.0), ("round.questions", 64), ("round.max_new_tokens", 512)]))
        with pytest.raises(ConfigError, match="preset"):
            node.check_config(load_config(None, environ={}, cli=[*on_cpu, ("round.preset", "no-such-preset")]))
    finally:
        node.close()


def test_a_new_temperature_waits_for_a_restart(tmp_path):
    node, _ = make_node(tmp_path)
    try:
        node.start()
        before = node.round_settings().temperature
        changed = load_config(None, environ={}, cli=[*NODE_CLI, ("round.temperature", 0.5)])
        assert node.apply_config(changed) == ["round.temperature"]
        assert node.round_settings().temperature == before == 1.0  # the trainer's, not the new one
    finally:
        node.close()

"""Two nodes' data path without the network: node A's round → bundle bytes → node B admits,
pools and trains on A's groups (I local + J external), re-scored by B itself."""

from __future__ import annotations


from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.prompt import PromptFormat
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.round import RoundSettings, run_round
from swarmling.app.swarm.verification.intake import IntakeContext, Rejected, admit_group
from swarmling.app.swarm.verification.pool import GroupPool, group_key
from swarmling.app.swarm.verification.wire import bundle_from_groups, decode_bundle, encode_bundle
from swarmling.app.config import Config
from swarmling.app.learning.tasks import load_preset

PEER_A = "12D3KooWNodeA"


def settings(external: int) -> RoundSettings:
    return RoundSettings(questions=4, completions=4, max_new_tokens=12, temperature=1.0, local_groups=4,
                         external_groups=external, prefill_answer=True, format_bonus=0.5)


def test_b_trains_on_groups_from_a(backend_factory, tmp_path):
    preset = load_preset("starter")
    node_a, node_b = backend_factory(tmp_path / "a"), backend_factory(tmp_path / "b")
    outcome_a = run_round(1, node_a, preset, Curriculum(preset), settings(0), RoundDraws(1, 1))
    data = encode_bundle(bundle_from_groups(outcome_a.groups, swarm="test", node_id=PEER_A, model="smollm2-135m",
                                            round_no=1, timestamp=1.0, prefill="<answer>"))

    ctx = IntakeContext(PromptFormat(), 0.5, 12 * 2, node_b.encode_prompt, node_b.tokenize)
    pool = GroupPool(ttl_s=600)
    admitted = [admit_group(g, PEER_A, ctx) for g in decode_bundle(data).groups]
    assert not [r for r in admitted if isinstance(r, Rejected) and "hash" in r.reason]
    def key(wire_group):
        return group_key(wire_group.spec.task_spec(), (c.text for c in wire_group.completions))

    for w, g in zip(decode_bundle(data).groups, admitted):
        if not isinstance(g, Rejected):
            assert pool.add(key(w), g) is None
    # the same bundle again is a replay
    for w in decode_bundle(data).groups:
        again = admit_group(w, PEER_A, ctx)
        if not isinstance(again, Rejected):
            assert pool.seen(key(w)) and pool.add(key(w), again) == "replay"

    # B scored A's completions itself, and agrees with A (same pinned reasoning-gym, same prompt)
    a_scores = {(g.task.spec, c.text): c.strict for g in outcome_a.groups for c in g.completions}
    b_groups = pool.available()
    assert b_groups
    for g in b_groups:
        for c in g.completions:
            assert a_scores[(g.task.spec, c.text)] == c.strict

    with_signal = [g for g in b_groups if g.has_signal]
    assert with_signal, "A's round had no group with signal: nothing to exchange"
    outcome_b = run_round(1, node_b, preset, Curriculum(preset), settings(2), RoundDraws(2, 1),
                          external=pool.available())
    assert outcome_b.record.external_groups == min(2, len(with_signal))
    assert outcome_b.record.external_available == len(pool)
    assert outcome_b.used_external and outcome_b.record.train is not None
    pool.mark_used(outcome_b.used_external)
    assert all(g not in pool.available() for g in outcome_b.used_external)  # never used twice


def test_pool_expires_and_caps():
    from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
    from swarmling.app.learning.tasks import regenerate
    from swarmling.backends.base import ChatPrompt

    now = [0.0]
    pool = GroupPool(ttl_s=10, max_groups=2, clock=lambda: now[0])
    preset = load_preset("starter")

    def group(i):
        t = regenerate(preset.spec("chain_sum", 0, 1, i))
        comps = [ScoredCompletion(f"{i}a", [1], None, "external", 0, True, 0), ScoredCompletion(f"{i}b", [1], None, "external", 1, True, 1)]
        return group_key(t.spec, (c.text for c in comps)), QuestionGroup(t, 0, ChatPrompt("", ""), [1], comps, PEER_A)

    assert pool.add(*group(1)) is None and pool.add(*group(2)) is None
    assert pool.add(*group(3)) == "full"
    now[0] = 11
    assert len(pool) == 0 and pool.add(*group(3)) is None
    assert pool.add(*group(1)) == "replay"  # still remembered for 2 × TTL
    now[0] = 40
    assert pool.add(*group(1)) is None


def test_node_takes_peer_bundles_through_its_inbox(backend_factory, tmp_path):
    """The seam the network layer uses: raw bytes in from any thread, refusals counted, J external
    groups trained on in the next round, recorded in the round's metrics."""
    from swarmling.app.config import load_config
    from swarmling.app.node.loop import Node
    from swarmling.app.paths import resolve_paths

    preset = load_preset(Config().round.preset)  # node B's: another preset's groups are set aside
    node_a = backend_factory(tmp_path / "a")
    outcome_a = run_round(1, node_a, preset, Curriculum(preset), settings(0), RoundDraws(3, 1))
    data = encode_bundle(bundle_from_groups(outcome_a.groups, swarm="test", node_id=PEER_A, model="smollm2-135m",
                                            round_no=1, timestamp=1.0, prefill="<answer>"))

    # No network (the inbox is the seam), no start evaluation, eager layers: what conftest sets for
    # every other node, here without the environment so the user's settings cannot leak in.
    config = load_config(None, environ={}, cli=[("round.questions", 2), ("round.completions", 4),
                                                 ("round.max_new_tokens", 12), ("round.external_groups", 2),
                                                 ("run.seed", 5), ("swarm.enabled", False), ("eval.every_rounds", 0),
                                                 ("train.cpu_compile", "off")])
    events = []
    node = Node(config, resolve_paths(tmp_path / "b"), events.append)
    try:
        node.start()
        assert node.swarm.inbox.offer(PEER_A, data)
        assert node.swarm.inbox.offer(PEER_A, data)  # replayed
        assert node.swarm.inbox.offer(PEER_A, b"\x00garbage")  # malformed
        assert node.swarm.inbox.offer("12D3KooWSomeoneElse", data)  # relabelled sender
        assert node.run(1) == 1
    finally:
        node.close()
    record = next(e.record.to_dict() for e in events if type(e).__name__ == "RoundFinished")
    usable = sum(g.has_signal for g in outcome_a.groups)
    assert usable, "A's round had no group with signal"
    assert record["external_groups"] >= 1
    assert record["external_rejected"] >= 2 + record["external_groups"]  # garbage, impostor, replays
    warnings = [e.text for e in events if type(e).__name__ == "Notice"]
    assert any("not a zlib stream" in w for w in warnings) and any("claims to come from" in w for w in warnings)

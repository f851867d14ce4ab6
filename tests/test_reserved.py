"""Held out means never trained on: no round draws a held-out question, whatever its seed, and a
peer's group on one is admitted (the peer did nothing wrong) and set aside. Real reasoning-gym
tasks; the fake backend where a round runs (pure logic)."""

from __future__ import annotations

import dataclasses

import numpy as np
from fakes import PEER, SETTINGS, FakeBackend
from fakes import intake_context as context

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.evaluation import AT_LEVEL_ITEMS, at_level_tasks, eval_tasks
from swarmling.app.learning.reserved import RESERVED_AT_LEVEL, draw_task, is_reserved, reserved_questions, unreserved
from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
from swarmling.app.learning.round import run_round
from swarmling.app.learning.tasks import EVAL_SEED, Task, TaskSpec, load_preset, regenerate
from swarmling.app.swarm.verification.intake import admit_group
from swarmling.app.swarm.verification.wire import bundle_from_groups
from swarmling.backends.base import ChatPrompt
from swarmling.app.commands.experiment.designs import DESIGNS

PRESET = load_preset("starter")


def test_every_held_out_set_is_reserved_the_fixed_the_at_level_and_the_experiments():
    reserved = reserved_questions("starter")
    assert all(t.question_hash in reserved for t in eval_tasks("starter"))
    for dataset, levels in PRESET.levels.items():
        for level in range(len(levels)):
            assert all(is_reserved(t, "starter") for t in at_level_tasks("starter", dataset, level, AT_LEVEL_ITEMS))
    for design in DESIGNS.values():
        assert design.eval_items <= RESERVED_AT_LEVEL
        for dataset, level in design.specialities:
            assert all(is_reserved(t, design.preset) for t in at_level_tasks(design.preset, dataset, level, design.eval_items))


def test_a_long_draw_stream_never_yields_a_reserved_question_where_plain_draws_do():
    """Level 0 of chain_sum (about 200 distinct questions) and leg_counting (74): a plain draw
    hits a held-out question often; the round's draw never does, at level 0 or at level 1, which
    holds level 0's questions too."""
    for dataset in ("chain_sum", "leg_counting"):
        rng = np.random.default_rng(7)
        plain = [regenerate(PRESET.spec(dataset, 0, int(rng.integers(EVAL_SEED)), int(rng.integers(1_000_000))))
                 for _ in range(300)]
        assert sum(is_reserved(t, "starter") for t in plain) > 30  # the test can fail: reserved questions do come up
        for level in (0, 1):
            rng = np.random.default_rng(8)
            drawn = [draw_task(PRESET, dataset, level, rng) for _ in range(1500)]
            assert not any(is_reserved(t, "starter") for t in drawn)
            assert all(t.spec.seed < EVAL_SEED for t in drawn)


def test_the_draw_is_the_same_from_the_same_stream():
    """A resumed node, or the other arm of an experiment's pair, draws the same questions."""
    def draws(rng):
        return [draw_task(PRESET, "chain_sum", 0, rng).question for _ in range(50)]
    assert draws(np.random.default_rng([3, 4])) == draws(np.random.default_rng([3, 4]))


def test_what_is_held_out_is_this_nodes_presets_question_whatever_preset_a_peer_names():
    held_out = eval_tasks("starter")[0]
    other = Task(TaskSpec("sapo9", held_out.spec.dataset, "{}", 1, 1), held_out.question, held_out.entry)
    group = QuestionGroup(other, 0, ChatPrompt("s", other.question), [1], [], "peerA")
    assert unreserved([group], "starter") == ([], [group])


def _reserved_training_spec():
    """A spec from the training seeds whose question is a held-out one."""
    rng = np.random.default_rng(11)
    while True:
        task = regenerate(PRESET.spec("chain_sum", 0, int(rng.integers(EVAL_SEED)), int(rng.integers(1_000_000))))
        if is_reserved(task, "starter"):
            return task


def test_a_peers_group_on_a_held_out_question_is_admitted_without_blame_and_never_trained_on():
    task = _reserved_training_spec()
    answer = str(task.entry["answer"])
    replies = [ScoredCompletion(f"{answer}</answer>", [1], None, "stop", 1.0, True, 1.0),
               ScoredCompletion("0</answer>", [1], None, "stop", 0.0, True, 0.0)] * 2
    sent = QuestionGroup(task, 0, ChatPrompt("s", task.question, "<answer>"), [1], replies)
    bundle = bundle_from_groups([sent], swarm="t", node_id=PEER, model="smollm2-135m", round_no=1, timestamp=1.0,
                                prefill="<answer>")
    admitted = admit_group(bundle.groups[0], PEER, context())
    assert isinstance(admitted, QuestionGroup) and admitted.strict_signal  # verified: right and wrong replies
    admitted.received_round = 1
    settings = dataclasses.replace(SETTINGS, external_groups=2)
    outcome = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), settings, RoundDraws(0, 1), external=[admitted])
    assert admitted not in outcome.trained and admitted not in outcome.waiting
    assert admitted in outcome.used_external  # it leaves the pool: not offered again
    assert outcome.record.external_held_out == 1 and outcome.record.external_groups == 0


def test_a_peers_group_of_another_preset_is_set_aside_without_blame():
    """An older release's node on "starter" and a node on another preset share one swarm: each
    verifies the other's groups, trains on neither, and counts them."""
    task = regenerate(load_preset("sapo9").spec("basic_arithmetic", 0, 5, 5))
    replies = [ScoredCompletion("1</answer>", [1], None, "stop", float(i % 2), True, float(i % 2)) for i in range(4)]
    theirs = QuestionGroup(task, 0, ChatPrompt("s", task.question, "<answer>"), [1], replies, "peerA", received_round=1)
    settings = dataclasses.replace(SETTINGS, external_groups=2)
    outcome = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), settings, RoundDraws(0, 1), external=[theirs])
    assert theirs not in outcome.trained and theirs in outcome.used_external
    assert outcome.record.external_other_preset == 1 and outcome.record.external_available == 1


def test_a_swarm_of_two_releases_blames_no_one_for_the_preset_that_changed(monkeypatch):
    """A node of today's release (starter-2) admits an older node's starter group as verified and sets
    it aside; the older node, which does not know starter-2, refuses today's groups without blame."""
    from swarmling.app.swarm.verification import intake

    old = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), SETTINGS, RoundDraws(0, 1)).groups[0]
    wire = bundle_from_groups([old], swarm="t", node_id=PEER, model="smollm2-135m", round_no=1, timestamp=1.0,
                              prefill="<answer>").groups[0]
    admitted = admit_group(wire, PEER, context())
    assert isinstance(admitted, QuestionGroup)
    admitted.received_round = 1
    new = load_preset("starter-2")
    outcome = run_round(1, FakeBackend(), new, Curriculum(new), dataclasses.replace(SETTINGS, external_groups=2),
                        RoundDraws(0, 1), external=[admitted])
    assert outcome.record.external_other_preset == 1 and admitted not in outcome.trained
    ours = bundle_from_groups(outcome.groups[:1], swarm="t", node_id=PEER, model="smollm2-135m", round_no=1,
                              timestamp=1.0, prefill="<answer>").groups[0]
    monkeypatch.setattr(intake, "preset_names", lambda: ["sapo9", "starter"])  # the older release's presets
    refused = admit_group(ours, PEER, context())
    assert not isinstance(refused, QuestionGroup) and refused.blame is False

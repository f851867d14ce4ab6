"""Rescue: nodes meet on the common stream's questions, and a peer's verified right reply on a
question a node got all wrong joins its group, reply by reply marked as a peer's. Real
reasoning-gym tasks and the real intake (wire encoding, regeneration, re-scoring); the fake
backend where a round runs (pure logic)."""

from __future__ import annotations

import dataclasses

import numpy as np
from fakes import PEER, SETTINGS, FakeBackend
from fakes import intake_context as context

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.rescue import (COMMON_SLOTS, RESCUE_REPLIES, RESCUE_REPLIES_PER_PEER, RESCUE_WAIT_ROUNDS,
                                           common_task, rescue)
from swarmling.app.learning.reserved import is_reserved
from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
from swarmling.app.learning.round import run_round, training_samples
from swarmling.app.learning.tasks import load_preset
from swarmling.app.metrics import format_round
from swarmling.app.swarm.verification.intake import admit_group
from swarmling.app.swarm.verification.wire import bundle_from_groups
from swarmling.backends.base import ChatPrompt
from swarmling.backends.microbatches import anchored_replies

PRESET = load_preset("starter-2")
RESCUING = dataclasses.replace(SETTINGS, common_questions=SETTINGS.questions, rescue=True, swarm="t")


def _questions(swarm: str, window: int, seed: int, draws: int = 40) -> set[str]:
    rng = np.random.default_rng(seed)
    return {common_task(PRESET, "chain_sum", 0, swarm, window, rng).question for _ in range(draws)}


def test_nodes_of_a_swarm_meet_on_the_common_stream_by_themselves():
    # two nodes (their own seeds) in the same window draw from the same few questions ...
    assert _questions("t", 7, seed=1) == _questions("t", 7, seed=2)
    assert len(_questions("t", 7, seed=1)) == COMMON_SLOTS
    # ... another window or another swarm, other questions
    assert not _questions("t", 7, seed=1) & _questions("t", 8, seed=1)
    assert not _questions("t", 7, seed=1) & _questions("u", 7, seed=1)


def test_the_common_stream_never_yields_a_held_out_question():
    # starter's leg_counting level 0 has 74 distinct questions, 40 of them reserved: plain slots hit them
    starter = load_preset("starter")
    rng = np.random.default_rng(0)
    for window in range(300):
        assert not is_reserved(common_task(starter, "leg_counting", 0, "t", window, rng), "starter")


def _right(task) -> str:
    return f"{task.entry['answer']}</answer>"


def _peer_group(task, rights: int, wrongs: int, peer: str = PEER) -> QuestionGroup:
    """A peer's group on `task` as this node's intake admits it: encoded, sent, verified."""
    replies = ([ScoredCompletion(_right(task), [1], None, "stop", 1.0, True, 1.0)] * rights
               + [ScoredCompletion("-1</answer>", [1], None, "stop", 0.0, True, 0.5)] * wrongs)
    sent = QuestionGroup(task, 0, ChatPrompt("s", task.question, "<answer>"), [1], replies)
    bundle = bundle_from_groups([sent], swarm="t", node_id=peer, model="smollm2-135m", round_no=1, timestamp=1.0,
                                prefill="<answer>")
    admitted = admit_group(bundle.groups[0], peer, context())
    assert isinstance(admitted, QuestionGroup), admitted
    admitted.received_round = 2
    return admitted


def test_a_peers_right_reply_rescues_a_group_the_node_got_all_wrong_within_two_rounds():
    first = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1))
    waiting = first.awaiting_rescue
    assert waiting and all(not g.solved and g.sampled_round == 1 for g in waiting)
    assert first.record.awaiting_rescue == len(waiting) and first.record.rescued_groups == 0
    target = waiting[0]
    theirs = _peer_group(target.task, rights=1, wrongs=3)

    second = run_round(2, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 2),
                       external=[theirs], awaiting_rescue=waiting)
    assert second.record.rescued_groups == 1 and second.record.rescued_replies_by_peer == {PEER: 1}
    assert "rescued 1 (1 peer)" in format_round(second.record)  # the headless line (the TUI's says the same)
    rescued = next(g for g in second.trained if g.task.question == target.task.question)
    assert rescued.source == "local" and rescued.strict_signal  # the signal it could not have had alone
    assert len(rescued.completions) == len(target.completions) + 1
    # the peer's reply trains as a peer's: weighted as one, outside the anchor; the own wrong ones as own
    samples = training_samples([rescued])
    assert [s.from_peer for s in samples] == [False] * len(target.completions) + [True]
    assert samples[-1].advantage > 0 and all(s.advantage < 0 for s in samples[:-1])
    mask, _ = anchored_replies(samples)
    assert mask == [True] * len(target.completions) + [False]
    assert theirs not in second.trained and theirs in second.used_external  # used once, then it leaves the pool
    assert all(g.task.question != target.task.question for g in second.awaiting_rescue)


def test_what_a_rescue_takes_is_bounded_per_peer_and_per_group():
    own = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1)).awaiting_rescue[0]
    peers = [_peer_group(own.task, rights=8, wrongs=0, peer=f"{PEER[:-1]}{c}") for c in "ABC"]
    result = rescue([own], peers, round_no=2)
    added = result.rescued[0].completions[len(own.completions):]
    assert len(added) == RESCUE_REPLIES < 3 * RESCUE_REPLIES_PER_PEER
    assert max(result.by_peer.values()) == RESCUE_REPLIES_PER_PEER and all(c.peer for c in added)


def test_a_group_no_peer_rescues_waits_two_rounds_then_goes():
    own = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1)).awaiting_rescue[0]
    wrong_only = _peer_group(own.task, rights=0, wrongs=2)
    assert rescue([own], [wrong_only], round_no=1 + RESCUE_WAIT_ROUNDS - 1).still_waiting == [own]
    assert rescue([own], [wrong_only], round_no=1 + RESCUE_WAIT_ROUNDS).still_waiting == []


def test_groups_awaiting_a_rescue_survive_a_restart_and_older_checkpoints_load():
    own = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1)).awaiting_rescue[0]
    rescued = rescue([own], [_peer_group(own.task, rights=1, wrongs=1)], round_no=2).rescued[0]
    again = QuestionGroup.from_state(rescued.to_state())
    assert again.sampled_round == 1 and [c.peer for c in again.completions] == [c.peer for c in rescued.completions]
    older = own.to_state()
    del older["sampled_round"]
    for c in older["completions"]:
        del c["peer"], c["from_other_model"]
    assert QuestionGroup.from_state(older).sampled_round is None


def test_a_lone_node_with_rescue_on_draws_and_trains_as_it_would_with_it_off():
    """The common stream's questions are ordinary training questions: alone, rescue changes what it
    trains on not at all (nothing arrives to rescue with)."""
    on = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1))
    off = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), dataclasses.replace(RESCUING, rescue=False),
                    RoundDraws(0, 1))
    assert [g.task.question for g in on.groups] == [g.task.question for g in off.groups]
    assert [g.task.question for g in on.trained] == [g.task.question for g in off.trained]


def test_one_question_is_rescued_once_and_a_group_with_its_own_success_is_never_replaced():
    first = run_round(1, FakeBackend(), PRESET, Curriculum(PRESET), RESCUING, RoundDraws(0, 1))
    older = first.awaiting_rescue[0]
    newer = dataclasses.replace(older, sampled_round=2)
    result = rescue([older, newer], [_peer_group(older.task, rights=2, wrongs=0)], round_no=2)
    assert [g.sampled_round for g in result.rescued] == [2] and result.still_waiting == []
    assert sum(result.by_peer.values()) == 2  # the peer's replies joined one group, not two

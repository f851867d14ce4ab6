"""One round's logic on a backend without a model: phases in order, the record it returns, what an
abandoned round leaves behind, and when peers' groups are asked for."""

from __future__ import annotations

import pytest
from fakes import SETTINGS, FakeBackend

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.events import PHASES
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.round import RoundSettings, run_round
from swarmling.app.learning.tasks import load_preset
from swarmling.backends.base import Abandoned


def test_a_round_runs_its_phases_in_order_and_records_them():
    preset, backend, phases, shared = load_preset("starter"), FakeBackend(), [], []
    outcome = run_round(1, backend, preset, Curriculum(preset), SETTINGS, RoundDraws(0, 1),
                        on_phase=phases.append, share=shared.append)
    assert tuple(phases) == PHASES  # the fake's replies differ in format: the group has a signal, it trains
    assert backend.train_steps == 1 and backend.handoffs == 1
    record = outcome.record
    assert record.round == 1 and record.questions == 4 and record.completions == 16
    # alone, the J external slots are filled with the node's own groups that carry a signal
    assert record.local_groups == sum(g.has_signal for g in outcome.groups) > 0
    assert record.external_groups == 0 and record.external_reward_mean is None
    assert record.train is not None and record.trained_samples > 0
    assert set(record.seconds) == set(PHASES)
    assert shared == [outcome.groups]
    # the flat JSON object of metrics.jsonl, with today's field names
    flat = record.to_dict()
    assert {"round", "reward_mean", "shaped_reward_mean", "signal_share", "tag_rate", "seconds", "levels", "train"} <= set(flat)
    assert "peers" not in flat and "swarm" not in flat


def test_peers_groups_are_asked_for_when_the_round_samples_its_training_set():
    preset, phases = load_preset("starter"), []

    def external():
        phases.append("asked")
        return []

    run_round(1, FakeBackend(), preset, Curriculum(preset), SETTINGS, RoundDraws(0, 1),
              external=external, on_phase=phases.append)
    assert phases.index("asked") == phases.index("sample") + 1


def test_an_abandoned_round_changes_nothing():
    preset = load_preset("starter")
    curriculum = Curriculum(preset)
    before = curriculum.to_dict()
    backend = FakeBackend()
    with pytest.raises(Abandoned):
        run_round(1, backend, preset, curriculum, SETTINGS, RoundDraws(0, 1), should_stop=lambda: True)
    assert curriculum.to_dict() == before and backend.train_steps == 0


def test_a_round_without_signal_does_not_train():
    preset = load_preset("starter")
    backend = FakeBackend()
    no_signal = RoundSettings(**{**SETTINGS.__dict__, "completions": 1})  # one reply per group: no spread
    outcome = run_round(1, backend, preset, Curriculum(preset), no_signal, RoundDraws(0, 1))
    assert backend.train_steps == 0 and outcome.record.train is None and "train" not in outcome.record.to_dict()
    assert outcome.trained == [] and outcome.used_external == []


def test_the_minimum_batch_waits_for_enough_groups_with_right_and_wrong_replies():
    """2 mixed groups a round, a minimum of 5: rounds 1 and 2 wait (and say so), round 3 trains on
    the 6 groups that waited and its own; the next batch starts empty."""
    from dataclasses import replace

    from fakes import ArithmeticBackend

    preset = load_preset("starter")
    backend = ArithmeticBackend(mixed=2)
    settings = replace(SETTINGS, min_signal_groups=5, local_groups=4, external_groups=0)
    curriculum, waiting, records, mixed = Curriculum(preset).focus(("chain_sum",), {"chain_sum": 0}), [], [], []
    for round_no in (1, 2, 3, 4):
        outcome = run_round(round_no, backend, preset, curriculum, settings, RoundDraws(3, round_no), waiting=waiting)
        curriculum, waiting = outcome.curriculum, outcome.waiting
        records.append(outcome.record)
        mixed.append([g for g in outcome.groups if g.strict_signal])
    assert [r.train is not None for r in records] == [False, False, True, False]
    assert [r.signal_groups for r in records] == [2, 4, 6, 2] and [r.waiting_groups for r in records] == [2, 4, 0, 2]
    assert len(backend.trained) == 1 and records[2].train.groups == 6
    # the step trained exactly the replies of the groups that waited and of its own round
    trained = sorted((tuple(s.prompt_ids), tuple(s.completion_ids)) for s in backend.trained[0])
    expected = sorted((tuple(g.prompt_ids), tuple(c.token_ids)) for groups in mixed[:3] for g in groups for c in g.completions)
    assert trained == expected
    assert waiting == mixed[3]  # round 4's groups wait for the next step

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

"""When the node measures its held-out score: the start's score is never measured for nothing."""

from __future__ import annotations

from swarmling.app.node.held_out import HeldOutSchedule


class Scores:
    """A stand-in evaluation: the result is the round whose weights it scored."""

    def __init__(self) -> None:
        self.measured: list[int] = []

    def __call__(self, weights_round: int, should_stop) -> int:
        self.measured.append(weights_round)
        return weights_round


def run(every: int, start_round: int, rounds: int) -> tuple[list[int], list]:
    scores = Scores()
    schedule = HeldOutSchedule(every, scores)
    schedule.at_start(start_round, key="base", should_stop=lambda: False)
    records = [schedule.after_round(r) for r in range(start_round + 1, start_round + rounds + 1)]
    return scores.measured, records


def test_the_base_models_score_reaches_the_first_record_even_when_every_round_is_evaluated():
    measured, records = run(every=1, start_round=0, rounds=3)
    assert records[0] == (0, 0)  # the base model's score, in round 1's record
    assert records[1:] == [(2, 2), (3, 3)]
    assert measured == [0, 2, 3]  # every measurement reached a record


def test_a_resume_just_before_a_due_round_measures_once_not_twice():
    measured, records = run(every=10, start_round=9, rounds=1)
    assert measured == [10] and records == [(10, 10)]


def test_a_resume_between_evaluations_records_the_start_then_the_due_rounds():
    measured, records = run(every=5, start_round=2, rounds=8)
    assert records[0] == (2, 2) and records[2] == (5, 5) and records[7] == (10, 10)
    assert [r for r in records if r is not None] == [(2, 2), (5, 5), (10, 10)] and measured == [2, 5, 10]


def test_where_the_sampler_can_switch_its_adapter_off_the_base_is_scored_after_the_first_round():
    """The first update comes before the base model's evaluation (minutes on a small CPU); the
    base model's score still reaches the first record, and nothing else is measured for it."""
    scores, base = Scores(), Scores()
    schedule = HeldOutSchedule(10, scores)
    schedule.at_start(0, key="base", should_stop=lambda: False, measure_base=base)
    assert base.measured == [] and scores.measured == []  # nothing before round 1
    records = [schedule.after_round(r) for r in range(1, 11)]
    assert records[0] == (0, 0) and base.measured == [0]
    assert [r for r in records if r is not None] == [(0, 0), (10, 10)] and scores.measured == [10]


def test_a_deferred_base_score_told_to_stop_is_measured_at_a_later_rounds_end():
    from swarmling.backends.base import Abandoned

    calls = []

    def base(weights_round, should_stop):
        calls.append(weights_round)
        if len(calls) == 1:
            raise Abandoned("paused")
        return "base"

    schedule = HeldOutSchedule(10, Scores())
    schedule.at_start(0, key="base", should_stop=lambda: False, measure_base=base)
    assert schedule.after_round(1, lambda: True) is None  # paused during it: the round's record has none
    assert schedule.after_round(2) == ("base", 0) and calls == [0, 0]


def test_nodes_sharing_a_base_score_measure_it_once_whether_deferred_or_not():
    shared: dict = {}
    first, second = Scores(), Scores()
    a, b = HeldOutSchedule(10, Scores(), shared), HeldOutSchedule(10, Scores(), shared)
    a.at_start(0, key="base", should_stop=lambda: False, measure_base=first)
    b.at_start(0, key="base", should_stop=lambda: False, measure_base=second)
    assert a.after_round(1) == (0, 0) and b.after_round(1) == (0, 0)
    assert first.measured == [0] and second.measured == []


def test_a_node_resumed_without_the_base_score_measures_it_after_its_next_round_unless_an_evaluation_is_due():
    scores, base = Scores(), Scores()
    schedule = HeldOutSchedule(3, scores)
    schedule.at_start(1, key="base", should_stop=lambda: False, measure_base=base, base_missing=True)
    assert scores.measured == [1] and base.measured == []  # the weights it resumed from, as before
    records = [schedule.after_round(r) for r in range(2, 7)]
    assert records[0] == (1, 1)  # round 2's record: the start's score
    assert records[1] == (3, 3)  # round 3 is due: its own weights first
    assert records[2] == (0, 0) and base.measured == [0]  # then the base model's
    assert records[3:] == [None, (6, 6)]


def test_the_deferred_base_score_waits_for_the_first_round_that_trained():
    """A first round without a learnable group would otherwise put the base model's evaluation
    (minutes on a small CPU) before the first update, which is what a new volunteer waits for."""
    base = Scores()
    schedule = HeldOutSchedule(120, Scores())
    schedule.at_start(0, key="base", should_stop=lambda: False, measure_base=base)
    assert [schedule.after_round(r, trained=False) for r in (1, 2)] == [None, None] and base.measured == []
    assert schedule.after_round(3, trained=True) == (0, 0)
    untrained = HeldOutSchedule(120, Scores())  # a node that finds nothing to learn still gets its mark
    untrained.at_start(0, key="base", should_stop=lambda: False, measure_base=base)
    assert [untrained.after_round(r, trained=False) for r in range(1, 11)][-1] == (0, 0)

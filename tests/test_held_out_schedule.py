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

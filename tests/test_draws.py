"""Common random numbers: a round's draws come from streams keyed by (seed, round, purpose), so
two nodes on the same seed (an experiment's two arms) draw the same questions and sampling seeds
whatever they train on, and a resumed node draws what it would have drawn."""

from __future__ import annotations

from fakes import SETTINGS, FakeBackend

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.round import run_round
from swarmling.app.learning.tasks import load_preset


class SeedRecorder(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.seeds: list[int] = []

    def generate(self, prompts, n, params, should_stop=None, on_progress=None):
        self.seeds.append(params.seed)
        return super().generate(prompts, n, params, should_stop, on_progress)


def arm(seed: int, external_groups: int, rounds: int = 4, fixed: bool = True):
    """What one arm of a pair draws over `rounds` rounds (it trains and carries its curriculum on)."""
    preset = load_preset("starter")
    curriculum = Curriculum(preset).focus(("chain_sum", "leg_counting"), {"chain_sum": 1, "leg_counting": 0} if fixed else {})
    backend, questions = SeedRecorder(), []
    settings = SETTINGS.__class__(**{**SETTINGS.__dict__, "external_groups": external_groups})
    for round_no in range(1, rounds + 1):
        outcome = run_round(round_no, backend, preset, curriculum, settings, RoundDraws(seed, round_no))
        curriculum = outcome.curriculum
        questions.append([(g.task.spec.dataset, g.level, g.task.question) for g in outcome.groups])
    return questions, backend.seeds


def test_the_arms_of_a_pair_draw_the_same_questions_and_sampling_seeds():
    alone, shared = arm(7, external_groups=0), arm(7, external_groups=2)
    assert alone == shared
    assert {d for round_ in alone[0] for d, _, _ in round_} <= {"chain_sum", "leg_counting"}
    assert all(level == {"chain_sum": 1, "leg_counting": 0}[d] for round_ in alone[0] for d, level, _ in round_)


def test_a_different_seed_draws_differently():  # the negative control
    assert arm(7, 0)[0] != arm(8, 0)[0] and arm(7, 0)[1] != arm(8, 0)[1]


def test_streams_are_keyed_by_round_and_purpose():
    a, b = RoundDraws(3, 5), RoundDraws(3, 5)
    assert a.stream("tasks").integers(1 << 30) == b.stream("tasks").integers(1 << 30)
    assert a.stream("tasks").integers(1 << 30) != a.stream("sampling").integers(1 << 30)
    assert a.stream("tasks").integers(1 << 30) != RoundDraws(3, 6).stream("tasks").integers(1 << 30)

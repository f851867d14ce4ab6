"""No constant answer pays, and held-out levels are large: the default preset's promise, checked
on real reasoning-gym draws (the fixed answer is the verifier's score of the most common answer)."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.app.config import Config
from swarmling.app.learning.evaluation import EVAL_LEVELS, fixed_answer_score, fixed_set_shortcuts, question_space
from swarmling.app.learning.reserved import draw_task
from swarmling.app.learning.tasks import load_preset

PRESET = Config().round.preset
SHORTCUT = 0.10  # what one fixed answer may score of a level's training draws
DRAWS = 1500


def test_the_default_preset_is_the_one_without_shortcuts():
    assert PRESET == "starter-2"


@pytest.mark.parametrize("dataset", load_preset(PRESET).datasets)
def test_no_fixed_answer_scores_more_than_a_tenth_of_any_levels_training_draws(dataset):
    preset = load_preset(PRESET)
    for level in range(len(preset.levels[dataset])):
        rng = np.random.default_rng([level, 17])
        fixed = fixed_answer_score([draw_task(preset, dataset, level, rng) for _ in range(DRAWS)])
        assert fixed.accuracy <= SHORTCUT, (dataset, level, fixed)


def test_nor_of_the_held_out_sets_items_and_its_levels_are_large():
    for dataset, fixed in fixed_set_shortcuts(PRESET).items():
        assert fixed.accuracy <= 0.125, (dataset, fixed)  # 5 of 40 items: sampling noise around 10 %
    preset = load_preset(PRESET)
    for dataset in preset.datasets:
        for level in range(min(EVAL_LEVELS, len(preset.levels[dataset]))):
            assert question_space(PRESET, dataset, level) >= 1000, (dataset, level)


def test_the_old_starter_preset_fails_the_same_check():
    """The check can fail: letter_counting's "1" pays on the old preset."""
    preset, rng = load_preset("starter"), np.random.default_rng(1)
    fixed = fixed_answer_score([draw_task(preset, "letter_counting", 0, rng) for _ in range(300)])
    assert fixed.answer == "1" and fixed.accuracy > 0.3

"""Reward shaping never ranks a wrong answer above a right one."""

from __future__ import annotations

import pytest

from swarmling.app.reward import score
from swarmling.app.tasks import load_preset, regenerate


@pytest.fixture(scope="module")
def task():
    return regenerate(load_preset("starter").spec("chain_sum", 0, 3, 4))


def test_strict_reward_needs_the_tag(task):
    right = task.entry["answer"]
    assert score(task, f"<answer>{right}</answer>", 0.0).strict == 1.0
    assert score(task, f"The answer is {right}", 0.0).strict == 0.0
    assert score(task, f"<answer>{right}", 0.0).strict == 0.0  # never closed


@pytest.mark.parametrize("bonus", [0.0, 0.1, 0.5, 1.0])
def test_right_beats_wrong_at_any_bonus(task, bonus):
    right = task.entry["answer"]
    wrong = str(int(right) + 1)
    replies = {
        "right": f"<answer>{right}</answer>",
        "partial": f"<answer>The sum is {right}</answer>",
        "wrong_formatted": f"<answer>{wrong}</answer>",
        "wrong_unformatted": f"{wrong}",
        "right_unformatted": f"{right}",
    }
    r = {k: score(task, v, bonus).reward for k, v in replies.items()}
    assert r["right"] >= r["wrong_formatted"] >= r["wrong_unformatted"]
    assert r["right"] > r["wrong_formatted"] or bonus == 1.0 and r["right"] == 2.0
    assert 0 < score(task, replies["partial"], bonus).strict < 1
    assert r["partial"] > r["wrong_formatted"]  # partial credit always beats the bonus alone


def test_propositional_logic_premise_copy_is_not_rewarded():
    preset = load_preset("sapo9")
    copied = 0
    for index in range(40):
        t = regenerate(preset.spec("propositional_logic", 0, 11, index))
        premise = t.entry["metadata"]["premises"][0]
        s = score(t, f"<answer>{premise}</answer>", 0.0)
        assert s.strict <= 0.05
        copied += 1
    assert copied == 40

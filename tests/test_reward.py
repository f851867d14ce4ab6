"""Reward shaping never ranks a wrong answer above a right one."""

from __future__ import annotations

import pytest

from swarmling.app.learning.reward import score
from swarmling.app.learning.tasks import Task, load_preset, preset_names, regenerate


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
    # the answer inside a longer reply is not the answer: no substring credit
    assert score(task, replies["partial"], bonus).strict == 0.0
    assert r["partial"] == r["wrong_formatted"]


@pytest.mark.parametrize("reply", ["18", "80", "8 8", "0 1 2 3 4 5 6 7 8 9", "7 + 1 = 8", "8.0.0"])
def test_a_reply_listing_candidates_earns_nothing(reply):
    """reasoning-gym's default scorer pays len(oracle)/len(reply) when the oracle is a substring."""
    spec = load_preset("starter").spec("basic_arithmetic", 0, 1, 0)
    task = Task(spec, "Calculate 5 + 3.", {"question": "Calculate 5 + 3.", "answer": "8", "metadata": {}})
    assert score(task, f"<answer>{reply}</answer>", 0.0).strict == 0.0
    assert score(task, "<answer>8</answer>", 0.0).strict == 1.0
    assert score(task, "<answer> 8 </answer>", 0.0).strict == 1.0  # reasoning-gym strips the extracted answer


def test_partial_credit_is_kept_only_where_a_preset_names_it():
    assert all(not load_preset(name).partial_credit for name in preset_names())
    spec = load_preset("starter").spec("calendar_arithmetic", 0, 1, 0)
    weekday = Task(spec, "What day?", {"question": "What day?", "answer": "Monday", "metadata": {"task": "weekday_of_date"}})
    assert score(weekday, "<answer>Tuesday</answer>", 0.0).strict == 0.0  # reasoning-gym pays 0.1 for any weekday


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

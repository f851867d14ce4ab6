"""Reward shaping never ranks a wrong answer above a right one; advantages and group selection."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.app.reward import score
from swarmling.app.rollout import QuestionGroup, ScoredCompletion, group_advantages, has_signal
from swarmling.app.sampler import select_groups
from swarmling.app.tasks import TaskSpec, load_preset, regenerate
from swarmling.backends.base import ChatPrompt


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


def test_advantages():
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    adv = group_advantages([0.0, 1.0, 0.0, 1.0])
    assert np.isclose(sum(adv), 0.0) and adv[1] > 0 > adv[0]
    assert np.isclose(np.std(adv), 1.0, atol=1e-3)
    assert not has_signal([0.5]) and has_signal([0.0, 0.1])


def _group(rewards, source="local"):
    t = regenerate(TaskSpec("starter", "chain_sum", load_preset("starter").levels["chain_sum"][0], 1, 1))
    comps = [ScoredCompletion("x", [1], None, "eos", r, True, r) for r in rewards]
    return QuestionGroup(t, 0, ChatPrompt("s", "u"), [1, 2], comps, source)


def test_selection_drops_zero_advantage_groups_and_caps():
    rng = np.random.default_rng(0)
    local = [_group([0, 0, 0]), _group([0, 1, 0]), _group([1, 1, 1]), _group([0.2, 0.0, 0.0])]
    sel = select_groups(local, [], local_groups=4, external_groups=0, rng=rng)
    assert len(sel.local) == 2 and all(g.has_signal for g in sel.local)
    sel = select_groups(local, [], local_groups=1, external_groups=0, rng=rng)
    assert len(sel.local) == 1
    external = [_group([0, 1], "peerA") for _ in range(5)] + [_group([1, 0], "peerB"), _group([1, 1], "peerC")]
    sel = select_groups(local, external, 4, 4, rng, max_per_peer=2)
    sources = [g.source for g in sel.external]
    assert sources.count("peerA") <= 2 and "peerC" not in sources and len(sel.external) == 3


def test_missing_external_groups_are_filled_with_local_ones():
    rng = np.random.default_rng(1)
    local = [_group([0, 1]) for _ in range(8)]
    alone = select_groups(local, [], local_groups=4, external_groups=4, rng=rng)
    assert (len(alone.local), len(alone.external)) == (8, 0)  # a lone node trains on I + J local groups
    one_peer = select_groups(local, [_group([1, 0], "peerA") for _ in range(3)], 4, 4, rng, max_per_peer=2)
    assert (len(one_peer.local), len(one_peer.external)) == (6, 2)
    full = select_groups(local, [_group([1, 0], p) for p in "ABCDEF"], 4, 4, rng, max_per_peer=2)
    assert (len(full.local), len(full.external)) == (4, 4)

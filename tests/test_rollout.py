"""Group advantages and the learning-signal test."""

from __future__ import annotations

import numpy as np

from swarmling.app.learning.rollout import group_advantages, has_signal


def test_advantages():
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    adv = group_advantages([0.0, 1.0, 0.0, 1.0])
    assert np.isclose(sum(adv), 0.0) and adv[1] > 0 > adv[0]
    assert np.allclose(adv, [-0.5, 0.5, -0.5, 0.5])  # centred, not scaled by the group's spread
    assert not has_signal([0.5]) and has_signal([0.0, 0.1])


def test_a_fading_format_bonus_fades_out_of_the_advantages():
    """Every reply wrong, some with a closed tag: the pull shrinks with the bonus, then stops."""
    wrong_tagged, wrong_untagged = (lambda bonus: 0.0 + bonus), (lambda bonus: 0.0)
    big = group_advantages([wrong_tagged(0.5), wrong_untagged(0.5)] * 2)
    small = group_advantages([wrong_tagged(0.1), wrong_untagged(0.1)] * 2)
    assert np.allclose(small, np.array(big) / 5)
    faded = [wrong_tagged(0.005), wrong_untagged(0.005)] * 2
    assert not has_signal(faded) and group_advantages(faded) == [0.0] * 4
    # a right answer among wrong ones keeps its full pull, whatever the bonus
    assert group_advantages([1.005, 0.005, 0.0, 0.0])[0] > 0.7


def test_every_reply_becomes_a_training_sample_that_knows_whether_a_peer_sent_it():
    """The trainer's KL anchor leaves peers' replies out (torch_grpo.py): a training sample says
    whose it is, and another model's replies say so too."""
    from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
    from swarmling.app.learning.round import training_samples
    from swarmling.app.learning.tasks import Task, TaskSpec
    from swarmling.backends.base import ChatPrompt

    def group(source: str, other_model: bool = False) -> QuestionGroup:
        replies = [ScoredCompletion("1", [5], None, "stop", 1.0, True, 1.0, sender_logprob=-2.0),
                   ScoredCompletion("2", [6], None, "stop", 0.0, True, 0.0, sender_logprob=-3.0)]
        return QuestionGroup(Task(TaskSpec("starter", "chain_sum", "{}", 0, 0), "1 + 0?", {}), 0, ChatPrompt("s", "1 + 0?", ""), [1],
                             replies, source=source, other_model=other_model)

    samples = training_samples([group("local"), group("peer-a"), group("peer-b", other_model=True)])
    assert [s.from_peer for s in samples] == [False, False, True, True, True, True]
    assert [s.from_other_model for s in samples] == [False] * 4 + [True, True]
    assert [s.advantage for s in samples[:2]] == [0.5, -0.5]

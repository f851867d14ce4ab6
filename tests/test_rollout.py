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

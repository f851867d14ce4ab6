"""Group advantages and the learning-signal test."""

from __future__ import annotations

import numpy as np

from swarmling.app.rollout import group_advantages, has_signal


def test_advantages():
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    adv = group_advantages([0.0, 1.0, 0.0, 1.0])
    assert np.isclose(sum(adv), 0.0) and adv[1] > 0 > adv[0]
    assert np.isclose(np.std(adv), 1.0, atol=1e-3)
    assert not has_signal([0.5]) and has_signal([0.0, 0.1])

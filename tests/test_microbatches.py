"""Microbatch packing and the sampler/trainer gap tally both trainers share: framework-free."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.backends.base import TrainSample
from swarmling.backends.microbatches import SamplerGap, pack_microbatches, sampler_logprobs


def sample(prompt: int, completion: int, behaviour=None) -> TrainSample:
    return TrainSample([1] * prompt, [2] * completion, 1.0, behaviour)


def test_widest_first_and_padded_width_within_the_budget():
    widths = [4, 10, 6, 40]
    groups = pack_microbatches(widths, token_budget=24)
    assert groups == [[3], [1, 2], [0]]  # 40 alone (over budget); 2 x 10 <= 24; 3 x 10 > 24
    assert pack_microbatches(widths, token_budget=1000) == [[3, 1, 2, 0]]


def test_sampler_logprobs_line_up_with_the_tokens():
    assert sampler_logprobs([sample(1, 2), sample(1, 1)]) is None
    flat = sampler_logprobs([sample(1, 2), sample(1, 1, [-0.5])])
    assert np.isnan(flat[:2]).all() and flat[2] == -0.5


def test_the_gap_counts_known_tokens_only():
    gap = SamplerGap()
    gap.add(np.array([-1.0, -1.0, -2.0]), np.array([-1.1, np.nan, -2.0]))
    gap.add(np.array([-1.0]), np.array([-2.0]))  # ratio e: outside [0.8, 1.2]
    assert gap.tokens == 3 and gap.mean == pytest.approx((0.1 + 0 + 1.0) / 3) and gap.outside_share == pytest.approx(1 / 3)
    assert SamplerGap().mean == 0.0 and SamplerGap().outside_share == 0.0


def test_the_sampler_bias_starts_at_the_first_step_then_moves_a_fifth_of_the_way():
    """Both trainers fold each step's sampler gap into the node's bias here."""
    gap = SamplerGap()
    assert gap.averaged_into(-0.3, steps_taken=5) == -0.3  # no token had a sampler logprob: unchanged
    gap.add(np.array([-1.0, -2.0]), np.array([-0.9, np.nan]))  # one known token, 0.1 below the sampler
    assert gap.averaged_into(-0.3, steps_taken=1) == pytest.approx(-0.1)
    assert gap.averaged_into(-0.3, steps_taken=2) == pytest.approx(0.8 * -0.3 + 0.2 * -0.1)

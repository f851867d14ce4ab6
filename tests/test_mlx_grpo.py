"""The GRPO loss is written once per framework: MLX's twin must give torch's loss and gradient on
the same tokens. Runs on Linux with mlx[cpu]; skipped with the reason where mlx cannot be installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core", reason="mlx is not installable here (pip install 'mlx[cpu]' on Linux)")

from swarmling.backends import mlx_grpo, torch_grpo  # noqa: E402
from swarmling.backends.settings import GrpoSettings  # noqa: E402


def mlx_loss(logp, old_logp, advantages, settings: GrpoSettings, importance_weight=None, ref_logp=None):
    """The MLX backend's loss from its parts: - (the token objectives - beta * k2) / tokens."""
    objective, _, _ = mlx_grpo.grpo_token_objective(logp, old_logp, advantages, settings, importance_weight)
    if ref_logp is not None and settings.kl_beta > 0:
        objective = objective - settings.kl_beta * mlx_grpo.k2_anchor(logp, ref_logp)
    return -objective.sum() / logp.size


def torch_loss_and_grad(logp, old, adv, settings, weight):
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    w = None if weight is None else torch.tensor(weight, dtype=torch.float64)
    obj, _, clipped = torch_grpo.grpo_token_objective(lp, torch.tensor(old, dtype=torch.float64),
                                                      torch.tensor(adv, dtype=torch.float64), settings, w)
    loss = -obj.sum() / lp.numel()
    loss.backward()
    return float(loss.detach()), lp.grad.numpy(), clipped.numpy()


def mlx_loss_and_grad(logp, old, adv, settings, weight):
    w = None if weight is None else mx.array(weight.astype(np.float32))
    args = (mx.array(old.astype(np.float32)), mx.array(adv.astype(np.float32)), settings, w)
    loss, grad = mx.value_and_grad(lambda lp: mlx_loss(lp, *args))(mx.array(logp.astype(np.float32)))
    _, _, clipped = mlx_grpo.grpo_token_objective(mx.array(logp.astype(np.float32)), *args)
    return float(loss), np.array(grad), np.array(clipped)


@pytest.mark.parametrize("with_weight", [False, True], ids=["plain", "importance-weighted"])
def test_same_loss_and_gradient_as_torch(with_weight):
    rng = np.random.default_rng(0)
    n = 400
    old = rng.uniform(-6, -0.01, n)
    logp = old + rng.normal(0, 0.3, n)  # ratios spread across both clip edges
    adv = rng.choice([-1.5, -0.5, 0.5, 1.5], n)
    weight = rng.uniform(0.2, 2.0, n) if with_weight else None
    settings = GrpoSettings(clip_low=0.2, clip_high=0.28, importance_cap=2.0, external_importance_cap=0.0,
                            external_negative_cap=0.0, kl_beta=0.0)
    t_loss, t_grad, t_clip = torch_loss_and_grad(logp, old, adv, settings, weight)
    m_loss, m_grad, m_clip = mlx_loss_and_grad(logp, old, adv, settings, weight)
    assert 0 < t_clip.sum() < n  # the test exercises clipped and unclipped tokens
    # float32 in MLX vs float64 in torch: agreement to float32 rounding over a 400-token mean
    assert m_loss == pytest.approx(t_loss, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(m_grad, t_grad, rtol=1e-4, atol=1e-7)
    assert (m_clip == t_clip).mean() > 0.99  # borderline tokens may flip at float32


def test_importance_weights_match():
    rng = np.random.default_rng(1)
    old, sampler = rng.uniform(-5, 0, 50), rng.uniform(-5, 0, 50)
    t = torch_grpo.truncated_importance_weight(torch.tensor(old), torch.tensor(sampler), 2.0).numpy()
    m = np.array(mlx_grpo.truncated_importance_weight(mx.array(old.astype(np.float32)), mx.array(sampler.astype(np.float32)), 2.0))
    np.testing.assert_allclose(m, t, rtol=1e-5)
    ts = torch_grpo.sequence_importance_weight(torch.tensor(-40.0), torch.tensor(-42.5), 5.0)
    ms = mlx_grpo.sequence_importance_weight(mx.array(-40.0), mx.array(-42.5), 5.0)
    assert float(ms) == pytest.approx(float(ts), rel=1e-5)


def test_the_kl_anchor_and_the_weight_of_peers_negatives_are_the_same_in_both():
    rng = np.random.default_rng(4)
    logp, ref = rng.normal(-2, 1, 12), rng.normal(-2, 1, 12)
    settings = GrpoSettings(clip_low=0.2, clip_high=0.28, importance_cap=2.0, external_importance_cap=0.0,
                            external_negative_cap=1.0, kl_beta=0.1)
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    kl = torch_grpo.k2_anchor(lp, torch.tensor(ref, dtype=torch.float64))
    (settings.kl_beta * kl.sum() / lp.numel()).backward()
    zeros = np.zeros(12)
    loss, grad = mx.value_and_grad(lambda x: mlx_loss(x, mx.array(logp.astype(np.float32)), mx.array(
        zeros.astype(np.float32)), settings, None, mx.array(ref.astype(np.float32))))(mx.array(logp.astype(np.float32)))
    assert np.isclose(float(loss), settings.kl_beta * kl.detach().sum().item() / 12, rtol=1e-4)  # advantages 0: the anchor alone
    assert np.allclose(np.array(grad), lp.grad.numpy(), atol=1e-5)
    for args in ((-30.0, -31.0, 10, -0.01, 1.0), (-30.0, -20.0, 10, -0.01, 1.0), (-5.0, -6.0, 4, 0.0, 0.5)):
        t = float(torch_grpo.negative_reply_weight(torch.tensor(args[0]), torch.tensor(args[1]), *args[2:]))
        m = float(mlx_grpo.negative_reply_weight(mx.array(args[0]), mx.array(args[1]), *args[2:]))
        assert np.isclose(t, m, rtol=1e-5)


def test_k3_and_k2_leave_out_what_they_do_not_count_in_both():
    logp, ref = np.array([-1.0, -201.0, -2.0]), np.array([-1.5, -1.0, -1.0])
    counted = np.array([True, False, True])
    for name in ("k3_kl", "k2_anchor"):
        t = getattr(torch_grpo, name)(torch.tensor(logp), torch.tensor(ref), torch.tensor(counted)).numpy()
        m = np.array(getattr(mlx_grpo, name)(mx.array(logp.astype(np.float32)), mx.array(ref.astype(np.float32)),
                                             mx.array(counted)))
        assert t[1] == 0 and m[1] == 0 and np.allclose(t, m, rtol=1e-5)


def test_a_reply_from_another_model_gets_no_ratio_in_both():
    """Across tokenizers a logprob ratio compares different segmentations: another model's right
    reply weighs 1 even with the sequence-level cap on, its wrong one 0; a same-model peer's
    unlikely reply is truncated by the ratio."""
    from swarmling.backends.base import TrainSample
    from swarmling.backends.mlx_grpo import token_weights as mlx_token_weights

    settings = GrpoSettings(clip_low=0.2, clip_high=0.28, importance_cap=0.0, external_importance_cap=2.0,
                            external_negative_cap=1.0, kl_beta=0.0)
    batch = [TrainSample([1], [5, 6, 7], 1.0, sequence_behaviour_logprob=-1.0, from_peer=True),  # same model, unlikely for us
             TrainSample([1], [5, 6], 1.0, sequence_behaviour_logprob=-1.0, from_peer=True, from_other_model=True),
             TrainSample([1], [5, 6], -1.0, sequence_behaviour_logprob=-1.0, from_peer=True, from_other_model=True),
             TrainSample([1], [5, 6], -1.0, sequence_behaviour_logprob=-1.0, from_peer=True)]  # same model, wrong
    old = np.full(9, -2.0)
    owner = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 3])
    t_negatives, m_negatives = [], []
    t = torch_grpo.external_weight(batch, owner, torch.tensor(old), settings, 0.0, t_negatives).numpy()
    m = np.array(mlx_token_weights(batch, mx.array(old.astype(np.float32)), settings, 0.0, m_negatives))
    same_model_wrong = float(torch_grpo.negative_reply_weight(torch.tensor(-4.0), torch.tensor(-1.0), 2, 0.0, 1.0))
    assert 0 < same_model_wrong < 0.1  # e^-3: text far likelier for its sender than for us counts little
    np.testing.assert_allclose(t, [np.exp(-5.0)] * 3 + [1.0, 1.0, 0.0, 0.0] + [same_model_wrong] * 2, rtol=1e-6)
    np.testing.assert_allclose(m, t, rtol=1e-5)
    assert t_negatives[0] == m_negatives[0] == 0.0 and np.allclose(t_negatives[1:], m_negatives[1:])
    assert np.isclose(t_negatives[1], same_model_wrong)

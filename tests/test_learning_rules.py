"""The learning rules' arithmetic, by hand: the k3 KL estimate (reported; the anchor is tests/test_anchor.py), the weight of a peer's reply pushed
down, and the warmup of the step size."""

from __future__ import annotations

import math

import torch

from swarmling.backends.torch_grpo import k3_kl, negative_reply_weight


def test_k3_is_exp_q_minus_q_minus_1_and_never_negative():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    ref = torch.tensor([-1.0, -1.0, -2.0, -3.5])
    by_hand = [math.exp(r - p) - (r - p) - 1 for p, r in zip(logp.tolist(), ref.tolist())]
    assert torch.allclose(k3_kl(logp, ref), torch.tensor(by_hand))
    assert k3_kl(logp, ref)[0] == 0 and bool((k3_kl(logp, ref) >= 0).all())
    # its mean over samples from pi estimates KL(pi || ref): here pi = N-like categorical check
    p, r = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.3, 0.2])
    exact = float((p * (p / r).log()).sum())
    expected_k3 = float((p * k3_kl(p.log(), r.log())).sum())
    assert math.isclose(expected_k3, exact, rel_tol=1e-6)


def test_k3_leaves_out_what_it_does_not_count_even_where_exp_would_overflow():
    """The reported KL: a peer's token our policy finds far less likely than the base (q = 200:
    exp overflows) adds nothing, so it cannot turn a step's figures into inf."""
    logp = torch.tensor([-1.0, -201.0, -2.0])
    ref = torch.tensor([-1.5, -1.0, -1.0])
    counted = torch.tensor([True, False, True])
    kl = k3_kl(logp, ref, counted)
    assert kl[1] == 0 and bool(torch.isfinite(kl).all())
    assert torch.allclose(kl[[0, 2]], k3_kl(logp[[0, 2]], ref[[0, 2]]))
    assert not torch.isfinite(k3_kl(logp, ref)).all()  # unmasked, it would overflow


def test_a_peers_negative_reply_weighs_its_ratio_corrected_by_our_own_sampler_gap_at_most_the_cap():
    # the same text, the same policy: our trainer's sum is lower than the sender's llama.cpp sum by
    # exactly our own measured gap per token (-0.02 x 10 tokens): the corrected ratio is 1
    assert math.isclose(float(negative_reply_weight(torch.tensor(-20.2), torch.tensor(-20.0), 10, -0.02, 1.0)), 1.0,
                        rel_tol=1e-6)
    # text our policy finds e^3 less likely than the sender did: weight e^-3
    assert math.isclose(float(negative_reply_weight(torch.tensor(-23.0), torch.tensor(-20.0), 10, 0.0, 1.0)),
                        math.exp(-3), rel_tol=1e-6)
    # likelier for us: capped at 1 (a reply pushed down never weighs more than one of ours)
    assert float(negative_reply_weight(torch.tensor(-10.0), torch.tensor(-20.0), 10, 0.0, 1.0)) == 1.0


def test_the_step_size_warms_up_linearly_then_holds():
    """Both trainers (torch and MLX) take their step size from here."""
    from swarmling.backends.settings import OptimSettings

    optim = OptimSettings(learning_rate=1e-4, warmup_steps=10, weight_decay=0.0, max_grad_norm=1.0,
                          microbatch_tokens=256, activation_checkpointing=False)
    sizes = [optim.step_size(k) for k in (0, 4, 9, 10, 500)]
    assert [round(s, 12) for s in sizes] == [1e-5, 5e-5, 1e-4, 1e-4, 1e-4]

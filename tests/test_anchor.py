"""The anchor pulls toward the reverse KL, checked exactly: a small categorical policy over replies
of two tokens, every reply enumerated, the anchor's expected gradient (replies weighted by their
probability under the policy, as samples of it would be) against the KL's gradient by autograd.

k3 as a loss (what ran until 2026-11) fails the same check: its expected gradient is the forward
KL's, grad KL(pi_base || pi). The test shows that too, so it can tell the two apart."""

from __future__ import annotations

import itertools

import pytest
import torch

from swarmling.backends.torch_grpo import k2_anchor, k3_kl

V = 4  # tokens


def k3_as_loss(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The anchor as it was: exp(q) - q - 1 with q = ref - logp, differentiated through logp."""
    q = ref_logp.detach() - logp
    return torch.exp(q) - q - 1


def _policy(first: torch.Tensor, second: torch.Tensor):
    """log pi(y1) and log pi(y2 | y1) from logits; `second` is (V, V), row y1."""
    return torch.log_softmax(first, -1), torch.log_softmax(second, -1)


def _expected_anchor_gradient(anchor, params, base):
    """sum over replies y of pi(y) * grad sum_t anchor(log pi_t(y), log base_t(y)), pi(y) held fixed."""
    first, second = params
    lp1, lp2 = _policy(first, second)
    bp1, bp2 = base
    total = torch.zeros(())
    for y1, y2 in itertools.product(range(V), range(V)):
        weight = (lp1[y1] + lp2[y1, y2]).exp().detach()
        logp = torch.stack([lp1[y1], lp2[y1, y2]])
        ref = torch.stack([bp1[y1], bp2[y1, y2]])
        total = total + weight * anchor(logp, ref).sum()
    return torch.autograd.grad(total, params)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def _sequence_kl(params, base, prefix_fixed: bool = False):
    """KL(pi || base) over whole replies. With `prefix_fixed`, the second token's KL is weighted by
    the first token's probability held fixed: the per-token KL at a fixed prefix that a per-token
    anchor can have as its gradient."""
    lp1, lp2 = _policy(*params)
    bp1, bp2 = base
    weight = lp1.exp().detach() if prefix_fixed else lp1.exp()
    return _kl(lp1, bp1) + (weight * _kl(lp2, bp2)).sum()


def _forward_kl_per_token(params, base):
    """The forward KL(base || pi) of each token at its prefix, prefixes drawn from pi (held fixed):
    what a per-token loss on samples of pi can have as its gradient."""
    lp1, lp2 = _policy(*params)
    bp1, bp2 = base
    return _kl(bp1, lp1) + (lp1.exp().detach() * _kl(bp2, lp2)).sum()


def _setup(seed: int, factorised: bool):
    g = torch.Generator().manual_seed(seed)
    first = torch.randn(V, generator=g, dtype=torch.float64)
    second = torch.randn(V if not factorised else 1, V, generator=g, dtype=torch.float64).expand(V, V).clone()
    base_first = torch.randn(V, generator=g, dtype=torch.float64) * 1.5
    base_second = torch.randn(V if not factorised else 1, V, generator=g, dtype=torch.float64).expand(V, V) * 1.5
    params = (first.requires_grad_(), second.requires_grad_())
    return params, (torch.log_softmax(base_first, -1), torch.log_softmax(base_second, -1))


def _close(a, b) -> bool:
    return all(torch.allclose(x, y, rtol=1e-9, atol=1e-12) for x, y in zip(a, b))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_anchors_expected_gradient_is_the_reverse_kls_and_k3s_is_the_forward_kls(seed):
    """Where the second token's distribution does not depend on the first (for the policy and the
    base alike) the per-token KL is the whole reply's KL: k2's expected gradient is exactly
    grad KL(pi || pi_base); k3-as-loss's is grad KL(pi_base || pi) of each token, a different vector."""
    params, base = _setup(seed, factorised=True)
    reverse = torch.autograd.grad(_sequence_kl(params, base), params)
    forward = torch.autograd.grad(_forward_kl_per_token(params, base), params)
    k2 = _expected_anchor_gradient(k2_anchor, params, base)
    k3 = _expected_anchor_gradient(k3_as_loss, params, base)
    assert _close(k2, reverse)
    assert _close(k3, forward)
    assert not _close(k3, reverse)  # today's k3-as-loss code fails the first assertion
    gap = max(float((a - b).abs().max()) for a, b in zip(k3, reverse))
    assert gap > 1e-2


@pytest.mark.parametrize("seed", [3, 4])
def test_with_a_prefix_the_anchor_is_the_reverse_kl_of_each_token_at_its_prefix(seed):
    """Where the second token depends on the first, k2's expected gradient is the reverse KL's per
    token at a fixed prefix; what it leaves out is how the first token changes the second's KL
    (torch_grpo.py says why that is small here). The enumeration shows both."""
    params, base = _setup(seed, factorised=False)
    per_token = torch.autograd.grad(_sequence_kl(params, base, prefix_fixed=True), params)
    whole = torch.autograd.grad(_sequence_kl(params, base), params)
    k2 = _expected_anchor_gradient(k2_anchor, params, base)
    assert _close(k2, per_token)
    assert torch.allclose(k2[1], whole[1], rtol=1e-9, atol=1e-12)  # the second token's own logits: exact
    assert not torch.allclose(k2[0], whole[0], atol=1e-6)  # the first's: the prefix term left out


def test_the_reported_kl_is_k3_unbiased_in_value_and_carries_no_gradient():
    p, r = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.3, 0.2])
    exact = float((p * (p / r).log()).sum())
    logp = p.log().requires_grad_()
    kl = k3_kl(logp, r.log())
    assert float((p * kl).sum()) == pytest.approx(exact, rel=1e-6)
    assert not kl.requires_grad


def test_k2_leaves_out_what_it_does_not_count_and_stays_bounded_on_unlikely_text():
    """A peer's token our policy finds e^200 times less likely than the base: k2 counts it with a
    finite gradient (200 nats), where k3's exp(q) overflowed; uncounted, it adds nothing."""
    logp = torch.tensor([-1.0, -201.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -1.0])
    counted = torch.tensor([True, False, True])
    k2_anchor(logp, ref, counted).sum().backward()
    assert logp.grad[1] == 0 and torch.allclose(logp.grad[[0, 2]], torch.tensor([0.5, -1.0]))
    logp.grad = None
    k2_anchor(logp, ref).sum().backward()
    assert bool(torch.isfinite(logp.grad).all()) and float(logp.grad[1]) == pytest.approx(-200.0)


def _group(prompt: int, lengths, from_peer: bool = False):
    from swarmling.backends.base import TrainSample

    return [TrainSample([prompt, 7], [1] * n, 0.0, from_peer=from_peer) for n in lengths]


def test_a_step_anchors_a_third_of_its_groups_and_in_expectation_the_whole_batch():
    """Anchoring a random share of the groups keeps the anchor's expected value and gradient: each
    group is drawn equally often, and the chosen tokens' sum is divided by the eligible tokens
    times k/n, so the expectation over the draw is the mean over every eligible token."""
    from swarmling.backends.microbatches import anchored_replies

    lengths = [[3, 5], [1, 1, 2], [8], [2, 2], [4], [6, 1]]
    samples = [s for g, ls in enumerate(lengths) for s in _group(g, ls)] + _group(9, [5, 5], from_peer=True)
    per_token = {g: float(g + 1) for g in range(len(lengths))}  # any figure per token, a different one per group
    eligible_tokens = sum(map(sum, lengths))
    full_mean = sum(per_token[s.prompt_ids[0]] * len(s.completion_ids) for s in samples if not s.from_peer) / eligible_tokens
    steps, estimates, counts = 6000, [], {g: 0 for g in per_token}
    for step in range(steps):
        mask, divisor = anchored_replies(samples, step)
        chosen = {s.prompt_ids[0] for s, m in zip(samples, mask) if m}
        assert len(chosen) == 2 and 9 not in chosen  # a third of six groups; never a peer's while own ones exist
        assert all(m == (s.prompt_ids[0] in chosen) for s, m in zip(samples, mask))  # whole groups
        assert divisor == pytest.approx(eligible_tokens * 2 / 6)
        estimates.append(sum(per_token[s.prompt_ids[0]] * len(s.completion_ids) for s, m in zip(samples, mask) if m) / divisor)
        for g in chosen:
            counts[g] += 1
    assert all(abs(c / steps - 1 / 3) < 0.03 for c in counts.values())
    assert sum(estimates) / steps == pytest.approx(full_mean, rel=0.03)
    assert anchored_replies(samples, 5) == anchored_replies(samples, 5)  # a resumed step draws the same


def test_one_group_is_always_anchored_and_peers_replies_alone_are_anchored_on_them():
    from swarmling.backends.microbatches import anchored_replies

    one = _group(0, [2, 3])
    assert anchored_replies(one, 3) == ([True, True], 5.0)
    peers = _group(1, [4], from_peer=True) + _group(2, [2], from_peer=True)
    mask, divisor = anchored_replies(peers, 0)
    assert sum(mask) == 1 and divisor == pytest.approx(6 / 2)

"""The GRPO objective in torch (written once per framework; the MLX backend has its twin).

Per token t of completion i with advantage A_i:

    r_t   = exp(logp_t - old_logp_t)                      (policy ratio)
    obj_t = min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i) * w_t
    kl_t  = exp(q_t) - q_t - 1,  q_t = ref_logp_t - logp_t   (k3 estimate of KL(pi || pi_base))
    loss  = - sum_t (obj_t - beta * kl_t) / N_tokens        (token-level mean over the whole batch, DAPO)

The KL anchor (Schulman's k3 estimator: unbiased on samples from pi, never negative) holds the
policy near the base model: without it nothing stops drift once clipping cannot act (one update per
batch: the ratio is 1 at the update). `w_t` is an optional truncated importance weight min(pi_old / pi_sampler, cap),
detached: it corrects for the sampler (llama.cpp on a quantized file) not being exactly the
trainer's policy (Yao et al. 2025, "truncated importance sampling"). It is 1 when unused.

Peers' completions (SAPO's external rollouts) were sampled by another node's policy, and only
its summed logprob of the whole text travels. With `external_importance_cap` > 0 every token of
such a completion gets the sequence-level weight min(exp(sum_t old_logp_t - sender_logp), cap):
how much likelier our policy finds the text than the sender did, truncated. It down-weights
text our policy would rarely write. The ratio is only meaningful when both sides tokenise the
text alike (same model family); across tokenizers it compares different segmentations. Off by
default, as in the paper, which treats external rollouts as if they were on-policy.

What is on by default is the part that matters (TOPR, arXiv 2503.14286; F-TIS, arXiv 2605.22537):
a peer's reply with a *negative* advantage gets the weight min(external_negative_cap, ratio), so
pushing down text our own policy would rarely write counts little. The sender's logprob is
llama.cpp's on a quantised model, ours the trainer's: for an identical policy that gap alone puts
the ratio below 1 (~6% of tokens outside [0.8, 1.2]), so "ours" is corrected by the per-token gap
this node measures between its own sampler and trainer on its own replies: like is compared with
like. A peer on another model gives no comparable logprob: its negatives weigh 0.
"""

from __future__ import annotations

import torch

from .settings import GrpoSettings



def grpo_token_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    settings: GrpoSettings,
    importance_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped objective (to maximise). All tensors are 1-D over the same tokens.

    Returns (objective, ratio, clipped_mask)."""
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    unclipped = ratio * advantages
    clipped = clipped_ratio * advantages
    objective = torch.minimum(unclipped, clipped)
    if importance_weight is not None:
        objective = objective * importance_weight.detach()
    return objective, ratio.detach(), (clipped < unclipped).detach()


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(q) - q - 1 with q = ref_logp - logp."""
    q = ref_logp.detach() - logp
    return torch.exp(q) - q - 1


def negative_reply_weight(old_logp_sum: torch.Tensor, sender_logp_sum: torch.Tensor, tokens: int,
                          sampler_bias: float, cap: float) -> torch.Tensor:
    """min(cap, pi_ours(text) / pi_sender(text)) for a peer's reply pushed down: "ours" is the
    trainer's summed logprob minus `tokens` times this node's own mean trainer-minus-sampler
    logprob per token (`sampler_bias`), so both sides are a sampler's view of the text; detached."""
    log_ratio = old_logp_sum.detach() - tokens * sampler_bias - sender_logp_sum
    return torch.clamp(torch.exp(torch.clamp(log_ratio, max=50.0)), max=cap)


def truncated_importance_weight(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.clamp(torch.exp(old_logp.detach() - sampler_logp), max=cap)


def sequence_importance_weight(old_logp_sum: torch.Tensor, sender_logp_sum: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old(text) / pi_sender(text), cap) per completion, from summed logprobs; detached."""
    return torch.clamp(torch.exp(torch.clamp(old_logp_sum.detach() - sender_logp_sum, max=50.0)), max=cap)

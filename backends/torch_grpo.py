"""The GRPO objective in torch (written once per framework; the MLX backend has its twin).

Per token t of completion i with advantage A_i:

    r_t   = exp(logp_t - old_logp_t)                      (policy ratio)
    obj_t = min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i) * w_t
    loss  = - sum_t obj_t / N_tokens                       (token-level mean over the whole batch, DAPO)

No KL term. `w_t` is an optional truncated importance weight min(pi_old / pi_sampler, cap),
detached: it corrects for the sampler (llama.cpp on a quantized file) not being exactly the
trainer's policy (Yao et al. 2025, "truncated importance sampling"). It is 1 when unused.

Peers' completions (SAPO's external rollouts) were sampled by another node's policy, and only
its summed logprob of the whole text travels. With `external_importance_cap` > 0 every token of
such a completion gets the sequence-level weight min(exp(sum_t old_logp_t - sender_logp), cap):
how much likelier our policy finds the text than the sender did, truncated. It down-weights
text our policy would rarely write. The ratio is only meaningful when both sides tokenise the
text alike (same model family); across tokenizers it compares different segmentations. Off by
default, as in the paper, which treats external rollouts as if they were on-policy.
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


def truncated_importance_weight(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.clamp(torch.exp(old_logp.detach() - sampler_logp), max=cap)


def sequence_importance_weight(old_logp_sum: torch.Tensor, sender_logp_sum: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old(text) / pi_sender(text), cap) per completion, from summed logprobs; detached."""
    return torch.clamp(torch.exp(torch.clamp(old_logp_sum.detach() - sender_logp_sum, max=50.0)), max=cap)

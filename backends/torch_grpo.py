"""The GRPO objective in torch (written once per framework; the MLX backend has its twin).

Per token t of completion i with advantage A_i:

    r_t   = exp(logp_t - old_logp_t)                      (policy ratio)
    obj_t = min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i) * w_t
    kl_t  = exp(q_t) - q_t - 1,  q_t = ref_logp_t - logp_t   (k3 estimate of KL(pi || pi_base))
    loss  = - sum_t obj_t / N_tokens + beta * sum_{own t} kl_t / N_own
            (the objective a token-level mean over the whole batch, DAPO; the anchor over own tokens)

The KL anchor (Schulman's k3 estimator: unbiased on samples from pi, never negative) holds the
policy near the base model: without it nothing stops drift once clipping cannot act (one update per
batch: the ratio is 1 at the update). It is estimated on this node's own replies only: k3 holds on
samples of pi, and on a peer's text, where pi can be far below pi_base, exp(q) is unbounded
(measured: one step's KL at 1,863 nats a token and a gradient norm of 4,657 in a step with peers'
replies; for one of its own sampled tokens the policy would need a probability e^13.5 times
below the base's). `w_t` is an optional truncated importance weight min(pi_old / pi_sampler, cap),
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

from collections.abc import Sequence

import torch

from .base import TrainSample
from .microbatches import SamplerGap, sampler_logprobs
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


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(q) - q - 1 with q = ref_logp - logp; 0 in
    value and gradient where `counted` is False. q is masked before the exp: a peer's token our
    policy finds unlikely enough overflows exp(q), and inf x 0 would make the whole step NaN."""
    q = ref_logp.detach() - logp
    if counted is not None:
        q = torch.where(counted, q, torch.zeros_like(q))
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


# ---- the weights of a microbatch's tokens -------------------------------------------------------
# `batch` is a microbatch's samples in scoring order, `owner` which of them each token belongs to.

def old_logprobs(batch: Sequence[TrainSample], owner: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """pi_old: given by the caller (multi-update rounds, tests) or, for the one update a round
    takes, the current policy itself (detached), so the ratio is exactly 1 at the update."""
    if all(sample.old_logprobs is None for sample in batch):
        return logp.detach()
    old = logp.detach().clone()
    for local, sample in enumerate(batch):
        if sample.old_logprobs is not None:
            old[owner == local] = torch.tensor(sample.old_logprobs, dtype=old.dtype, device=old.device)
    return old


def token_weights(batch: Sequence[TrainSample], owner: torch.Tensor, old: torch.Tensor, settings: GrpoSettings,
                  gap: SamplerGap, sampler_bias: float, negatives: list[float]) -> torch.Tensor | None:
    """The importance weight `w_t` of each token: the sampler's correction on this node's own
    replies times the sequence-level weight of peers' replies; None where neither applies. Tallies
    the sampler gap in `gap` and each peer negative's weight in `negatives`; `sampler_bias` is the
    node's running gap, used where this batch has none of its own replies."""
    weight = sampler_weight(batch, old, settings.importance_cap, gap)
    bias = gap.signed_mean if gap.tokens else sampler_bias
    external = external_weight(batch, owner, old, settings, bias, negatives)
    if external is not None:
        weight = external if weight is None else weight * external
    return weight


def external_weight(batch: Sequence[TrainSample], owner: torch.Tensor, old: torch.Tensor, settings: GrpoSettings,
                    sampler_bias: float, negatives: list[float]) -> torch.Tensor | None:
    """Sequence-level weights of peers' completions: all of them truncated at
    external_importance_cap when set, and those with a negative advantage at
    external_negative_cap; None where no weight applies. A reply from another model (another
    tokenizer) gets no ratio whatever the caps: its right replies weigh 1, its wrong ones 0 while
    the negative cap is on."""
    cap, negative_cap = settings.external_importance_cap, settings.external_negative_cap
    external = [local for local, sample in enumerate(batch) if sample.sequence_behaviour_logprob is not None]
    if not external or (cap <= 0 and negative_cap <= 0):
        return None
    weight = torch.ones_like(old)
    for local in external:
        sample = batch[local]
        mask = owner == local
        pushed_down = negative_cap > 0 and sample.advantage < 0
        if sample.from_other_model:  # no comparable logprob: no ratio, and its wrong replies not pushed down
            if pushed_down:
                weight[mask] = 0.0
                negatives.append(0.0)
            continue
        total = old[mask].sum()
        sender = torch.tensor(sample.sequence_behaviour_logprob, dtype=old.dtype, device=old.device)
        if cap > 0:
            weight[mask] = sequence_importance_weight(total, sender, cap)
        if pushed_down:
            w = negative_reply_weight(total, sender, int(mask.sum()), sampler_bias, negative_cap)
            weight[mask] = torch.minimum(weight[mask], w)
            negatives.append(float(w))
    return weight


def sampler_weight(batch: Sequence[TrainSample], old: torch.Tensor, cap: float, gap: SamplerGap) -> torch.Tensor | None:
    """Truncated importance weight pi_old / pi_sampler on the tokens this node sampled (1
    elsewhere; None when off or no token has a sampler logprob); tallies their gap."""
    flat = sampler_logprobs(batch)
    if flat is None:
        return None
    gap.add(old.cpu().numpy(), flat)
    if cap <= 0:
        return None
    sampler = torch.from_numpy(flat).to(dtype=old.dtype, device=old.device)
    known = ~torch.isnan(sampler)
    weight = torch.ones_like(old)
    weight[known] = truncated_importance_weight(old[known], sampler[known], cap)
    return weight

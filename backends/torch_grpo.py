"""The GRPO objective in torch (written once per framework; the MLX backend has its twin).

Per token t of completion i with advantage A_i:

    r_t   = exp(logp_t - old_logp_t)                      (policy ratio)
    obj_t = min(r_t * A_i, clip(r_t, 1 - eps_low, 1 + eps_high) * A_i) * w_t
    d_t   = logp_t - ref_logp_t                           (log pi - log pi_base)
    loss  = - sum_t obj_t / N_tokens + beta * sum_{anchored t} d_t^2 / 2 / N_anchored
            (the objective a token-level mean over the whole batch, DAPO; the anchor a mean over
            its own tokens)

With one update per round old_logp is the policy itself, so r_t = 1 at the update and the clip
never binds: what runs is a REINFORCE step with a group baseline, the importance weights and the
anchor. The clip acts only where a caller gives pi_old (several updates on one batch).

The anchor to the base model is k2, ½(log pi - log pi_base)^2, used as a loss. Its gradient
d_t * grad log pi_t has, on tokens sampled from pi, the expectation grad KL(pi || pi_base) of the
next token's distribution at the token's prefix: the *reverse* KL, which lets the policy take
probability away from answers the base model likes, at a price that grows with how far it moved.
Why not the alternatives:
- k3 (exp(q) - q - 1, q = ref - logp) as a loss, what ran until 2026-11: unbiased in value, but
  its expected gradient is E_pi[(1 - pi_base/pi) grad log pi] = grad KL(pi_base || pi), the
  *forward* KL, which grows without bound as the policy sharpens away from the base's wrong
  answers: exactly the learning a rare-success task needs (measured: 20.8 % with it against
  65.8 % without on rare-success seed 200).
- k1 folded into the reward (-beta * sum_t d_t per reply) gives the whole reply's KL gradient, the
  prefix's share included, but it is a reward spread in every group (signal where there is none)
  and its variance is the reply's.
k2 per token leaves out how a token changes the KL of the tokens after it; the replies here are
short (an answer of a few tokens) and that term small. The *reported* KL stays k3 on the node's
own replies: an unbiased, never negative estimate of KL(pi || pi_base) per token.

Which tokens are anchored: the node's own replies, where the expectation above holds. A batch with
none of them (peers' groups alone) is anchored on peers' replies instead: there k2 is no KL
estimate, but its gradient is bounded by |d_t| (k3's exp(q) reached 1,863 nats a token on a peer's
text) and pulls log pi back toward log pi_base on the very text the step moves, so no step runs
without an anchor. `w_t` is an optional truncated importance weight min(pi_old / pi_sampler, cap),
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
    """Per-token k3 estimate of KL(pi || pi_ref), for reporting: exp(q) - q - 1 with q = ref_logp -
    logp; 0 where `counted` is False. q is masked before the exp: a peer's token our policy finds
    unlikely enough overflows exp(q), and inf x 0 would make the whole step NaN. Not a loss: its
    gradient is the forward KL's (see the module's docstring)."""
    q = ref_logp.detach() - logp.detach()
    if counted is not None:
        q = torch.where(counted, q, torch.zeros_like(q))
    return torch.exp(q) - q - 1


def k2_anchor(logp: torch.Tensor, ref_logp: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token anchor loss ½(log pi - log pi_ref)^2, 0 in value and gradient where `counted` is
    False. On tokens sampled from pi its expected gradient is grad KL(pi || pi_ref) of the token's
    distribution at its prefix (the module's docstring; tests/test_anchor.py checks it by
    enumeration)."""
    d = logp - ref_logp.detach()
    if counted is not None:
        d = torch.where(counted, d, torch.zeros_like(d))
    return 0.5 * d * d


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

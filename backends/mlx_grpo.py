"""The GRPO objective in MLX: the twin of `torch_grpo.py` (same formula, same conventions; see
there for the derivation). A test runs both on the same tokens and compares loss and gradient."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .base import TrainSample
from .microbatches import sampler_logprobs
from .settings import GrpoSettings


def grpo_token_objective(
    logp: mx.array,
    old_logp: mx.array,
    advantages: mx.array,
    settings: GrpoSettings,
    importance_weight: mx.array | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """Per-token clipped objective (to maximise); returns (objective, ratio, clipped_mask)."""
    ratio = mx.exp(logp - old_logp)
    clipped_ratio = mx.clip(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    unclipped = ratio * advantages
    clipped = clipped_ratio * advantages
    objective = mx.minimum(unclipped, clipped)
    if importance_weight is not None:
        objective = objective * mx.stop_gradient(importance_weight)
    return objective, mx.stop_gradient(ratio), mx.stop_gradient(clipped < unclipped)


def truncated_importance_weight(old_logp: mx.array, sampler_logp: mx.array, cap: float) -> mx.array:
    return mx.minimum(mx.exp(mx.stop_gradient(old_logp) - sampler_logp), cap)


def sequence_importance_weight(old_logp_sum: mx.array, sender_logp_sum: mx.array, cap: float) -> mx.array:
    return mx.minimum(mx.exp(mx.minimum(mx.stop_gradient(old_logp_sum) - sender_logp_sum, 50.0)), cap)


def k3_kl(logp: mx.array, ref_logp: mx.array, counted: mx.array | None = None) -> mx.array:
    """As torch_grpo.k3_kl (reported, not a loss): 0 where `counted` is False, q masked before the exp."""
    q = mx.stop_gradient(ref_logp) - mx.stop_gradient(logp)
    if counted is not None:
        q = mx.where(counted, q, mx.zeros_like(q))
    return mx.exp(q) - q - 1


def k2_anchor(logp: mx.array, ref_logp: mx.array, counted: mx.array | None = None) -> mx.array:
    """As torch_grpo.k2_anchor: ½(log pi - log pi_ref)^2, 0 where `counted` is False."""
    d = logp - mx.stop_gradient(ref_logp)
    if counted is not None:
        d = mx.where(counted, d, mx.zeros_like(d))
    return 0.5 * d * d


def negative_reply_weight(old_logp_sum: mx.array, sender_logp_sum: mx.array, tokens: int, sampler_bias: float,
                          cap: float) -> mx.array:
    log_ratio = mx.stop_gradient(old_logp_sum) - tokens * sampler_bias - sender_logp_sum
    return mx.minimum(mx.exp(mx.minimum(log_ratio, 50.0)), cap)


def token_weights(batch: Sequence[TrainSample], old: mx.array, grpo: GrpoSettings, sampler_bias: float,
                  negatives: list[float]) -> mx.array | None:
    """Per-token weight of the GRPO objective, as torch_grpo.token_weights: the truncated pi_old /
    pi_sampler on tokens this node sampled, times the sequence-level weight of peers'
    completions when `external_importance_cap` is on, and at most external_negative_cap for a
    peer's reply with a negative advantage; None when none applies. A reply from another model
    (another tokenizer) gets no ratio whatever the caps: its right replies weigh 1, its wrong ones
    0 while the negative cap is on."""
    weight = None
    sampler = sampler_logprobs(batch) if grpo.importance_cap > 0 else None
    if sampler is not None:
        known = ~np.isnan(sampler)
        capped = truncated_importance_weight(old, mx.array(np.where(known, sampler, 0.0).astype(np.float32)),
                                             grpo.importance_cap)
        weight = mx.where(mx.array(known), capped, 1.0)
    senders = [s.sequence_behaviour_logprob for s in batch]
    cap, negative_cap = grpo.external_importance_cap, grpo.external_negative_cap
    if (cap > 0 or negative_cap > 0) and any(x is not None for x in senders):
        parts, offset = [], 0
        for s, sender in zip(batch, senders):
            n = len(s.completion_ids)
            w = mx.array(1.0)
            pushed_down = negative_cap > 0 and s.advantage < 0
            if sender is not None and s.from_other_model:  # no comparable logprob: no ratio
                if pushed_down:
                    w = mx.array(0.0)
                    negatives.append(0.0)
            elif sender is not None:
                total, sent = old[offset : offset + n].sum(), mx.array(sender, dtype=mx.float32)
                if cap > 0:
                    w = sequence_importance_weight(total, sent, cap)
                if pushed_down:
                    negative = negative_reply_weight(total, sent, n, sampler_bias, negative_cap)
                    w = mx.minimum(w, negative)
                    negatives.append(float(negative))
            parts.append(mx.broadcast_to(w, (n,)))
            offset += n
        external = mx.concatenate(parts)
        weight = external if weight is None else weight * external
    return weight

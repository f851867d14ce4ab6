"""The GRPO objective in MLX: the twin of `torch_grpo.py` (same formula, same conventions; see
there for the derivation). A test runs both on the same tokens and compares loss and gradient."""

from __future__ import annotations

import mlx.core as mx

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


def grpo_loss(logp: mx.array, old_logp: mx.array, advantages: mx.array, settings: GrpoSettings,
              importance_weight: mx.array | None = None, ref_logp: mx.array | None = None) -> mx.array:
    """- sum of (the token objectives - beta * k2) / number of tokens (DAPO's token-level mean)."""
    objective, _, _ = grpo_token_objective(logp, old_logp, advantages, settings, importance_weight)
    if ref_logp is not None and settings.kl_beta > 0:
        objective = objective - settings.kl_beta * k2_anchor(logp, ref_logp)
    return -objective.sum() / logp.size

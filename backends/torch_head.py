"""log pi(token | prefix) at completion positions from the backbone's final hidden states: the
output head, the temperature (and Gemma's softcap) and the log-softmax, as one autograd function.

Why by hand: with a 49k-token vocabulary every elementwise pass over the logits costs as much as
a large matmul on the CPU. Autograd through `gather - logsumexp` after `linear / T` makes about
ten such passes for a chunk (forward, recompute, scatter of the gather's gradient, the sum of two
full-size gradients, the division's backward); written out, the backward is one matmul and two
passes: softmax from the saved log-normaliser, scaled by the incoming gradient, minus it at the
target. The logits are kept for the backward when they are small (a CPU microbatch's chunk: no
second head matmul) and recomputed when not (a GPU microbatch's many chunks: one chunk of logits
alive at a time, as activation checkpointing would).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Logits a chunk may keep for its backward pass. A CPU microbatch's completion positions (~200 at
# the default 256 tokens) take ~40 MB; a GPU microbatch's chunks of 512 take ~100 MB each, and
# tens of them would be held until the backward, so those recompute.
KEEP_LOGITS_BYTES = 64 * 2**20


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def logits_at(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, softcap: float | None) -> torch.Tensor:
    """Logits at the sampling temperature, at least fp32: (hidden / T) W^T, or
    softcap * tanh(z / softcap) / T."""
    wide = torch.promote_types(weight.dtype, torch.float32)
    if softcap:
        z = torch.nn.functional.linear(hidden.to(weight.dtype), weight).to(wide)
        return torch.tanh(z / softcap).mul_(softcap / temperature)
    # The temperature divides the (narrow) hidden states, not the (wide) logits: one pass saved.
    # In fp32, as the logits were divided before: bf16 hidden states would round once more.
    return torch.nn.functional.linear((_at_least_fp32(hidden) / temperature).to(weight.dtype), weight).to(wide)


class TokenLogprob(torch.autograd.Function):
    """log_softmax(logits)[target] for each row of `hidden` (fp32), differentiable in `hidden`
    (and in `weight` when it trains: full fine-tuning's tied embeddings)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, softcap: float | None, keep: bool):
        logits = logits_at(hidden, weight, temperature, softcap)
        lse = torch.logsumexp(logits, dim=-1)
        out = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        ctx.temperature, ctx.softcap = temperature, softcap
        ctx.save_for_backward(hidden, weight, targets, lse, logits if keep else None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kept logits are overwritten in place
    def backward(ctx, grad):
        hidden, weight, targets, lse, logits = ctx.saved_tensors
        temperature, softcap = ctx.temperature, ctx.softcap
        if logits is None:
            logits = logits_at(hidden, weight, temperature, softcap)
        # d out / d logits = onehot(target) - softmax(logits): written into the logits' own buffer.
        capped = None
        if softcap:  # d logits / d z = (1 - tanh^2) / T, with tanh = logits * T / softcap
            capped = logits.mul(temperature / softcap).square_().neg_().add_(1.0).div_(temperature)
        grad_logits = logits.sub_(lse.unsqueeze(-1)).exp_().mul_(-grad.unsqueeze(-1))
        rows = torch.arange(targets.shape[0], device=targets.device)
        grad_logits[rows, targets] += grad
        if capped is not None:
            grad_z = grad_logits.mul_(capped)
            scale = 1.0
        else:  # z = (hidden / T) W^T
            grad_z = grad_logits
            scale = 1.0 / temperature
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = ((grad_z.to(weight.dtype) @ weight) * scale).to(hidden.dtype)  # scaled before rounding
        if ctx.needs_input_grad[1]:
            # In the weight's own dtype, as autograd would (full fine-tuning's tied embeddings).
            grad_weight = grad_z.t().to(weight.dtype) @ (_at_least_fp32(hidden) * scale).to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                   softcap: float | None, chunk: int) -> torch.Tensor:
    """log pi(target | prefix) for each row of `hidden`, `chunk` rows of logits at a time."""
    keep = min(chunk, hidden.shape[0]) * weight.shape[0] * 4 * -(-hidden.shape[0] // chunk) <= KEEP_LOGITS_BYTES
    return torch.cat([
        TokenLogprob.apply(hidden[start : start + chunk], weight, targets[start : start + chunk], temperature,
                           softcap, keep)
        for start in range(0, hidden.shape[0], chunk)
    ])


def per_sample_lists(per_sample: Sequence[torch.Tensor]) -> list[list[float]]:
    """Per-sample tensors as lists, with one copy to the CPU."""
    if not per_sample:
        return []
    flat = torch.cat(list(per_sample)).cpu()
    return [part.tolist() for part in flat.split([len(t) for t in per_sample])]

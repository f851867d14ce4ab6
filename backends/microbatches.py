"""What the torch and MLX trainers do the same outside their frameworks: pack rows into
microbatches under a token budget, line the sampler's per-token logprobs up with the trainer's
tokens, and tally how far sampler and trainer disagree."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .base import TrainSample

# A token's ratio pi_train / pi_sampler outside this band counts as a disagreement in the metrics.
RATIO_BAND = (0.8, 1.2)


def pack_microbatches(widths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Row indices, widest first, grouped so that each group right-padded to its widest (its
    first) row stays within `token_budget` tokens; a row wider than the budget is a group of its
    own. Rows are the shared-prefix rows of `shared_prefix.py` (a prompt and its completions)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
        if groups and (len(groups[-1]) + 1) * widths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def own_tokens(samples: Sequence[TrainSample]) -> int:
    """Completion tokens of this node's own replies: what the reported KL is estimated on (peers'
    replies are no samples of this node's policy; torch_grpo.py)."""
    return sum(len(s.completion_ids) for s in samples if not s.from_peer)


# The anchor's reference (a forward of the base without gradients over the anchored replies and
# their prompts) cost 30 % of a step with every group anchored (bench: an fp32 step on a 2-core AVX2
# EPYC 12.7 s, 3.8 s of it the reference; 22-30 % in bf16). Each step anchors a random share of
# its groups instead, weighted so that the anchor's expected gradient and the reported KL's
# expected value stay what they were with every group (`anchored_replies`).
ANCHOR_GROUP_SHARE = 1 / 3


def anchored_replies(samples: Sequence[TrainSample], step: int = 0) -> tuple[list[bool], float]:
    """Which replies the anchor acts on this step, and the token count its sum is divided by.

    Eligible: this node's own replies, or, in a batch with none of them (peers' groups alone),
    every reply, so that no step runs without an anchor (torch_grpo.py says why k2 is safe on peers'
    text). Of the eligible replies' groups (one prompt each) a random `ANCHOR_GROUP_SHARE`, at least
    one, is anchored, drawn from the step's number (a resumed step draws the same). Each group is
    in with probability k/n, so dividing the chosen tokens' sum by the eligible tokens times k/n is
    the mean over every eligible token in expectation (Horvitz-Thompson): the anchor's expected
    gradient and the KL estimate are the full batch's, for k/n of the reference's cost."""
    eligible = [not s.from_peer for s in samples] if own_tokens(samples) else [True] * len(samples)
    groups = sorted({tuple(s.prompt_ids) for s, e in zip(samples, eligible) if e})
    if not groups:
        return [False] * len(samples), 0.0
    k = max(1, math.ceil(len(groups) * ANCHOR_GROUP_SHARE - 1e-9))
    picked = np.random.default_rng([step, len(groups)]).choice(len(groups), size=k, replace=False)
    chosen = {groups[int(i)] for i in picked}
    mask = [e and tuple(s.prompt_ids) in chosen for s, e in zip(samples, eligible)]
    eligible_tokens = sum(len(s.completion_ids) for s, e in zip(samples, eligible) if e)
    return mask, eligible_tokens * k / len(groups)


def sampler_logprobs(samples: Sequence[TrainSample]) -> np.ndarray | None:
    """The sampler's logprob of every completion token, samples concatenated in order; NaN for
    the tokens of samples without them (re-tokenised external completions). None if no sample
    has them."""
    if all(s.behaviour_logprobs is None for s in samples):
        return None
    return np.concatenate([
        np.asarray(s.behaviour_logprobs if s.behaviour_logprobs is not None else [np.nan] * len(s.completion_ids),
                   dtype=np.float64)
        for s in samples
    ])


@dataclass
class SamplerGap:
    """Mean |log pi_train - log pi_sampler| and the share of ratios outside `RATIO_BAND`, over
    the tokens whose sampler logprob is known, accumulated across microbatches."""

    abs_sum: float = 0.0
    signed_sum: float = 0.0
    outside: int = 0
    tokens: int = 0

    def add(self, trainer_logp: np.ndarray, sampler_logp: np.ndarray) -> None:
        """Per-token logprobs of the same tokens; NaN sampler entries are skipped."""
        known = ~np.isnan(sampler_logp)
        delta = np.asarray(trainer_logp, dtype=np.float64)[known] - sampler_logp[known]
        ratio = np.exp(delta)
        self.abs_sum += float(np.abs(delta).sum())
        self.signed_sum += float(delta.sum())
        self.outside += int(((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])).sum())
        self.tokens += int(known.sum())

    @property
    def mean(self) -> float:
        return self.abs_sum / self.tokens if self.tokens else 0.0

    @property
    def signed_mean(self) -> float:
        """Mean log pi_train - log pi_sampler per token: below 0 on average for the sampler's own
        tokens (it is minus a KL), which biases a sender's llama.cpp logprob against ours."""
        return self.signed_sum / self.tokens if self.tokens else 0.0

    @property
    def outside_share(self) -> float:
        return self.outside / self.tokens if self.tokens else 0.0

    def averaged_into(self, sampler_bias: float, steps_taken: int) -> float:
        """The node's sampler bias after this step (both trainers): this step's signed mean at the
        first update, then an average that weighs it 0.2; unchanged when no token had a sampler
        logprob (peers' re-tokenised replies alone)."""
        if not self.tokens:
            return sampler_bias
        return self.signed_mean if steps_taken <= 1 else 0.8 * sampler_bias + 0.2 * self.signed_mean

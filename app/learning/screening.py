"""Peers' free text, screened before training on it.

With `reward.prefill_answer = false` (the reasoning mode a larger model wants) a reply carries
free text before its `<answer>`, and the verifier checks only the answer: a right answer pushes
up whatever text came with it. "Hail to the Thief" (arXiv 2511.09780) poisons decentralised GRPO
exactly so, with right answers whose reasoning carries a payload. This node's own policy is the
judge: a peer's reply pushed up (a positive advantage) that surprises it, per token, by more than
`train.external_text_margin` nats beyond what it expects is text this node would not write, and
its whole group is dropped (its advantages, centred on the other replies alone, would still
reward the answer the payload came with). Only replies pushed up are checked: a phrase is learnt
only where it comes with a positive advantage (one carried by every reply of a group gets
advantages summing to zero, and pushing text down teaches nothing to write), and honest replies
checked for nothing are never dropped by chance. Nobody is blamed: an honest peer whose policy
has drifted far, or one on another model, can fail the check too.

"What it expects" is the policy's own entropy at each position: a token's surprise is
-log pi(token | prefix) - H(pi(. | prefix)), which is 0 on average for text the policy samples
itself, at whatever temperature and entropy. Compared with the plain mean log-prob per token
(the figure of merit first tried), this removes what made honest replies of the shipped 135M model
spread over ±2 nats a token around their mean (questions and positions differ in entropy, and
that was the whole spread), which let a payload through. The check uses no figure the sender
supplies, so it applies as it stands to peers on another model (their honest text, less like
ours, is dropped more often).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from ...backends.base import TrainSample
from .rollout import QuestionGroup

# Trainer.token_surprise: -log pi(token | prefix) - H(pi(. | prefix)) per completion token.
SurpriseScorer = Callable[[Sequence[TrainSample]], list[list[float]]]


@dataclass(frozen=True)
class Screening:
    kept: list[QuestionGroup]
    dropped: list[QuestionGroup]
    # The most surprising reply's mean surprise per token, over the replies screened.
    highest: float | None = None


def screen_peer_text(groups: Sequence[QuestionGroup], surprise: SurpriseScorer, margin: float) -> Screening:
    """`groups` (peers') split into those whose every reply pushed up has a mean surprise per token
    under our policy of at most `margin`, and those with one above it."""
    pushed_up = [[c for c, a in zip(g.completions, g.advantages()) if a > 0] for g in groups]
    per_token = iter(surprise([TrainSample(g.prompt_ids, c.token_ids, 0.0)
                               for g, replies in zip(groups, pushed_up) for c in replies]))
    kept, dropped, means = [], [], []
    for g, replies in zip(groups, pushed_up):
        reply_means = [fmean(s) for s in (next(per_token) for _ in replies) if s]
        means.extend(reply_means)
        (dropped if any(m > margin for m in reply_means) else kept).append(g)
    return Screening(kept, dropped, max(means) if means else None)

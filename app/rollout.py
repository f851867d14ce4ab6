"""Question-groups: one task, its prompt and G scored completions — what a round learns from
(and, later, what nodes share). Advantages are group-normalised rewards."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean, pstdev

from ..backends.base import ChatPrompt
from .tasks import Task

ADVANTAGE_EPS = 1e-4


@dataclass
class ScoredCompletion:
    text: str
    token_ids: list[int]
    sampler_logprobs: list[float] | None  # None for completions re-tokenised from text
    finish_reason: str
    strict: float
    well_formed: bool
    reward: float
    sender_logprob: float | None = None  # a peer's completion: the sender's summed sampling logprob


@dataclass
class QuestionGroup:
    task: Task
    level: int
    prompt: ChatPrompt
    prompt_ids: list[int]
    completions: list[ScoredCompletion]
    source: str = "local"  # "local" or the sending peer's id

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.completions]

    @property
    def strict_mean(self) -> float:
        return fmean(c.strict for c in self.completions)

    @property
    def solved(self) -> bool:
        return any(c.strict >= 0.999 for c in self.completions)

    @property
    def has_signal(self) -> bool:
        return has_signal(self.rewards)

    def advantages(self) -> list[float]:
        return group_advantages(self.rewards)


def has_signal(rewards: list[float]) -> bool:
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-9


def group_advantages(rewards: list[float]) -> list[float]:
    """(r - mean) / (std + eps) within the group; all zeros when every reward is equal."""
    if not has_signal(rewards):
        return [0.0] * len(rewards)
    mean, std = fmean(rewards), pstdev(rewards)
    return [(r - mean) / (std + ADVANTAGE_EPS) for r in rewards]

"""Question-groups: one task, its prompt and G scored completions — what a round learns from
(and, later, what nodes share).

Advantages are group-centred rewards, r - mean(r), without dividing by the group's standard
deviation (as Dr. GRPO): divided, a group whose replies differ only by the format bonus would get
the same advantages at a bonus of 0.005 as at 0.5, so well-formed wrong answers would keep being
pushed up long after the bonus faded. Centred only, a group's pull is proportional to how much
its rewards differ, and a group whose rewards differ by less than MIN_SPREAD (a fading format
bonus, nothing else) is not worth a training slot at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from statistics import fmean

from ...backends.base import ChatPrompt
from .reward import RIGHT  # a reply the verifier scored at least this is right
from .tasks import Task, TaskSpec, regenerate

MIN_SPREAD = 0.05  # the least reward spread a group needs to be trained on
# Peers' groups are trained on in the round they arrived here or the next, no later (the pool
# offers them that long, and a group waiting for a step is dropped past it).
EXTERNAL_MAX_AGE_ROUNDS = 1


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
    # A peer's reply in an own group (a rescue, learning/rescue.py): the peer's id, and whether
    # another model than this node's sampled it. Trained on as a peer's, reply by reply.
    peer: str | None = None
    from_other_model: bool = False


@dataclass
class QuestionGroup:
    task: Task
    level: int
    prompt: ChatPrompt
    prompt_ids: list[int]
    completions: list[ScoredCompletion]
    source: str = "local"  # "local" or the sending peer's id
    received_round: int | None = None  # a peer's group: the round of ours in which it was admitted
    other_model: bool = False  # a peer's group sampled by another model than this node's
    sampled_round: int | None = None  # an own group waiting for a rescue: the round that sampled it

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.completions]

    @property
    def strict_mean(self) -> float:
        return fmean(c.strict for c in self.completions)

    @property
    def solved(self) -> bool:
        return any(c.strict >= RIGHT for c in self.completions)

    @property
    def has_signal(self) -> bool:
        return has_signal(self.rewards)

    @property
    def strict_signal(self) -> bool:
        """Right and wrong replies: a spread of the verifier's score, not of the format bonus alone."""
        strict = [c.strict for c in self.completions]
        return len(strict) > 1 and max(strict) - min(strict) >= MIN_SPREAD

    def fresh_at(self, round_no: int) -> bool:
        """Still trainable in `round_no`: ours always, a peer's up to EXTERNAL_MAX_AGE_ROUNDS after it arrived."""
        return self.received_round is None or round_no - self.received_round <= EXTERNAL_MAX_AGE_ROUNDS

    @property
    def format_only(self) -> bool:
        """Its signal comes from the format bonus alone: every reply is equally right or wrong."""
        return self.has_signal and len({c.strict for c in self.completions}) == 1

    def advantages(self) -> list[float]:
        return group_advantages(self.rewards)

    # ---- kept in a checkpoint while it waits for a training step (plain JSON) ----
    def to_state(self) -> dict:
        s, p = self.task.spec, self.prompt
        return {"spec": [s.preset, s.dataset, s.config, s.seed, s.index], "level": self.level,
                "prompt": [p.system, p.user, p.prefill], "prompt_ids": list(self.prompt_ids),
                "completions": [asdict(c) for c in self.completions], "source": self.source,
                "received_round": self.received_round, "other_model": self.other_model,
                "sampled_round": self.sampled_round}

    @classmethod
    def from_state(cls, state: dict) -> QuestionGroup:
        """The group as saved (its task regenerated from the spec); raises TaskError, KeyError,
        TypeError or ValueError on a state that is not one."""
        return cls(regenerate(TaskSpec(*state["spec"])), int(state["level"]), ChatPrompt(*state["prompt"]),
                   list(state["prompt_ids"]), [ScoredCompletion(**c) for c in state["completions"]],
                   state["source"], state["received_round"], bool(state.get("other_model", False)),
                   state.get("sampled_round"))


# What the round hands the swarm: its scored groups, to share (returns at once).
ShareCallback = Callable[[list[QuestionGroup]], None]


def has_signal(rewards: list[float]) -> bool:
    return len(rewards) > 1 and max(rewards) - min(rewards) >= MIN_SPREAD


def group_advantages(rewards: list[float]) -> list[float]:
    """r - mean(r) within the group; all zeros when the group has no signal."""
    if not has_signal(rewards):
        return [0.0] * len(rewards)
    mean = fmean(rewards)
    return [r - mean for r in rewards]

"""How a question is put to the model and how its reply is read: the system prompt, the reply's
pre-started `<answer>`, where sampling stops, and the score.

One place for all of it, because three parts must agree exactly: the round (generates and
scores its own groups), the evaluation (the same, near-greedily), and the swarm's intake, which
rebuilds the prompt a peer's replies answered (to tokenise and train on them) and scores them
with this node's verifier. A peer's reply travels whole, prefill included; the prefill is ours
to put back in front of our own replies.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...backends.base import ChatPrompt
from .reward import CLOSE, OPEN, Score, score
from .tasks import Task

# Measured on the shipped 135M model with the reply pre-started by "<answer>" (starter preset,
# 18 questions x 8 completions): with this one-example prompt 52% of replies close the tag and 89%
# of groups carry a learning signal; a plain instruction gave 8% and 50%.
SYSTEM_PROMPT = "Reply with only the final answer inside <answer></answer> tags, for example: <answer>42</answer>"
# The reasoning mode (no prefill) asks for the reasoning first: its text is what a larger model learns
# from, and what peers' replies are screened on (learning/screening.py).
REASONING_SYSTEM_PROMPT = ("Think briefly, step by step, then give the final answer inside <answer></answer> tags, "
                           "for example: 6 times 7 is 42, so <answer>42</answer>")
# Sampling stops once a reply closes its answer: nothing after it is scored.
STOP = (CLOSE,)


@dataclass(frozen=True)
class PromptFormat:
    """reward.prefill_answer: pre-start every reply with "<answer>" so that a tiny model answers
    in the scored format (off: the reply is free text, reasoning before its answer)."""

    prefill_answer: bool = True

    @property
    def prefill(self) -> str:
        return OPEN if self.prefill_answer else ""

    @property
    def system(self) -> str:
        return SYSTEM_PROMPT if self.prefill_answer else REASONING_SYSTEM_PROMPT

    def prompt(self, question: str) -> ChatPrompt:
        return ChatPrompt(self.system, question, self.prefill)

    def whole_reply(self, completion: str) -> str:
        """A sampled completion as the assistant's whole reply (the prefill in front of it)."""
        return self.prefill + completion

    def score(self, task: Task, completion: str, format_bonus: float) -> Score:
        """A completion this node's sampler wrote after the prefill, scored by this node's verifier."""
        return score(task, self.whole_reply(completion), format_bonus)

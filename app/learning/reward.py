"""Scoring a completion against the locally regenerated task.

strict  = 1 when reasoning-gym's scorer calls the extracted <answer> right, else 0; partial
          credit only for the datasets a preset names in `partial_credit` (scorers that grade
          real structure). reasoning-gym's default scorer gives len(oracle)/len(answer) whenever
          the oracle is a substring of the reply ("18" earns 0.5 for "8", a list of candidates
          earns something): kept, that would reward guessing many answers over committing to one.
reward  = strict + format_bonus * well_formed

`format_bonus` is set by the node each round as bonus * (1 - its recent tag rate), so it fades as
the model learns to close the tag. A right answer is always well formed (nothing is extracted
otherwise), so reward(right) = 1 + bonus > bonus = reward(any wrong answer with a closed tag):
the shaping can never rank a wrong answer above a right one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .tasks import Task, load_preset

OPEN, CLOSE = "<answer>", "</answer>"
RIGHT = 1.0 - 1e-9  # a scorer's full marks, give or take float rounding


@dataclass(frozen=True)
class Score:
    strict: float  # in [0, 1]
    well_formed: bool
    reward: float
    answer: str | None = None  # what the reply put in its (last) <answer>, as scored


def extract(full_reply: str) -> str | None:
    from reasoning_gym.utils import extract_answer

    return extract_answer(full_reply)


@lru_cache(maxsize=64)
def _scorer(dataset: str):
    from reasoning_gym.factory import DATASETS

    dataset_cls, config_cls = DATASETS[dataset]
    return dataset_cls(config_cls(size=1, seed=0))


def strict_score(task: Task, answer: str | None) -> float:
    if answer is None:
        return 0.0
    try:
        score = float(_scorer(task.spec.dataset).score_answer(answer, task.entry))
    except Exception:
        return 0.0
    if task.spec.dataset == "propositional_logic" and _copies_premise(answer, task.entry):
        # Known defect: a premise is always a "valid conclusion" (1.0 on 56% of items).
        return 0.0
    if task.spec.dataset in load_preset(task.spec.preset).partial_credit:
        return max(0.0, min(1.0, score))
    return 1.0 if score >= RIGHT else 0.0


def _normalise_formula(text: str) -> str:
    return re.sub(r"[\s()]", "", text)


def _copies_premise(answer: str, entry: dict) -> bool:
    premises = entry.get("metadata", {}).get("premises", [])
    norm = _normalise_formula(answer)
    return any(norm == _normalise_formula(p) for p in premises)


def score(task: Task, full_reply: str, format_bonus: float) -> Score:
    """`full_reply` is the assistant's whole reply, prefill included."""
    answer = extract(full_reply)
    strict = strict_score(task, answer)
    # Any answer with credit counts as well formed, so partial credit also always beats the bonus.
    well_formed = strict > 0 or (answer is not None and answer.strip() != "")
    return Score(strict, well_formed, strict + (format_bonus if well_formed else 0.0), answer)

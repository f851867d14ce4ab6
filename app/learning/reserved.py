"""Held out means never trained on: the evaluation's questions are reserved by their text.

The held-out sets come from seeds no round draws (tasks.EVAL_SEED), but a seed is not a question:
the easiest levels hold a few hundred distinct questions (3,000 draws of chain_sum's level 0 give
200, leg_counting's 74) and level 0's questions recur inside level 1's, so a node drawing 8 a
round meets most held-out questions within 30 rounds, and a sharing node, which also trains on its
peers' questions, more of them. So every question of every held-out set is reserved by the hash of
its text, across datasets and levels:

- the fixed set (`evaluation.eval_tasks`),
- the first `RESERVED_AT_LEVEL` at-level items of every dataset at every level: the node's own
  at-level set (`evaluation.AT_LEVEL_ITEMS`) and an experiment's sets (`Design.eval_items`) are
  their first items, so they are reserved too.

A round that draws a reserved question draws again (`draw_task`); a peer's group on one is
received and verified as any other (the peer did nothing wrong) and never selected for training
(`unreserved`), counted in the round's record. Reserving is local and needs no agreement: each
node derives the same set from the pinned reasoning-gym.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .evaluation import at_level_tasks, eval_tasks
from .rollout import QuestionGroup
from .tasks import Preset, Task, TaskError, load_preset, regenerate

RESERVED_AT_LEVEL = 40  # at-level items reserved per (dataset, level): an experiment's sets are their first
# A level whose questions are this often reserved in a row is all but used up by the held-out sets:
# an error that says so, not a loop (the smallest starter level, 74 questions, redraws ~4 in 5).
MAX_REDRAWS = 500


@lru_cache(maxsize=8)
def reserved_questions(preset_name: str) -> frozenset[str]:
    """The question hashes no round of this preset trains on."""
    preset = load_preset(preset_name)
    tasks = [*eval_tasks(preset_name)]
    for dataset, levels in preset.levels.items():
        for level in range(len(levels)):
            tasks.extend(at_level_tasks(preset_name, dataset, level, RESERVED_AT_LEVEL))
    return frozenset(t.question_hash for t in tasks)


def is_reserved(task: Task, preset_name: str) -> bool:
    """Whether `task` reads as a held-out question of `preset_name` (this node's preset, whatever
    preset a peer's task came from: the same question may be in both)."""
    return task.question_hash in reserved_questions(preset_name)


def draw_task(preset: Preset, dataset: str, level: int, rng: np.random.Generator) -> Task:
    """A training question of `dataset` at `level` that no held-out set holds: drawn, and drawn
    again while it is reserved (from the same stream: a node resumed, or the other arm of an
    experiment's pair, draws the same questions)."""
    for _ in range(MAX_REDRAWS):
        task = regenerate(preset.training_spec(dataset, level, rng))
        if not is_reserved(task, preset.name):
            return task
    raise TaskError(f"{dataset} at level {level} of preset {preset.name}: {MAX_REDRAWS} draws in a row were held-out "
                    "questions; the level has too few questions to train on beside its held-out sets")


def unreserved(groups: Sequence[QuestionGroup], preset_name: str) -> tuple[list[QuestionGroup], list[QuestionGroup]]:
    """(groups a round may train on, groups on questions held out by this node's preset): a peer's
    group on a held-out question is set aside, without blame."""
    reserved = [is_reserved(g.task, preset_name) for g in groups]
    return [g for g, r in zip(groups, reserved) if not r], [g for g, r in zip(groups, reserved) if r]


def of_preset(groups: Sequence[QuestionGroup], preset_name: str) -> tuple[list[QuestionGroup], list[QuestionGroup]]:
    """(groups of this node's preset, groups of another): a swarm carries every preset's groups
    (verified as any other: the peer did nothing wrong), but a node trains on the tasks its own
    preset names. Another preset's are no practice for them, and an older one's may pay a
    shortcut ("starter": letter_counting's "1"), so they are set aside."""
    return ([g for g in groups if g.task.spec.preset == preset_name],
            [g for g in groups if g.task.spec.preset != preset_name])

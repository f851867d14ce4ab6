"""Rescue: a success found anywhere becomes everyone's signal (SAPO's "Aha moments", made to travel).

A group whose G replies are all wrong teaches its node nothing: every advantage is zero. If a
peer, on the *same question*, found a right reply, that reply joins the group beside the node's
own wrong ones, and the group carries a signal the node could not have had alone.

Meeting on the same question needs no coordination: part of every round's questions come from
the **common stream**, drawn from a handful of questions per (swarm, preset, dataset, level,
window), the window being a slice of wall-clock time (an experiment's: the round number, so that a
resumed chunk and both arms of a pair draw the same). Nodes at the same level in the same window
therefore often draw the same questions. A lone node loses nothing by it: they are ordinary
training questions, never reserved held-out ones.

No new wire field: a peer's group carries its task spec, which the receiver regenerates and
verifies as it does every peer group (learning/tasks.py, swarm/verification/intake.py), so a rescue
is recognised by the question's text alone and a peer cannot fake one; its replies were re-scored
by this node's own verifier. What joins a group is bounded: at most RESCUE_REPLIES_PER_PEER right
replies from any one peer and RESCUE_REPLIES in all. Own all-wrong groups on common questions wait
RESCUE_WAIT_ROUNDS rounds for a rescue (peers' replies arrive a round or more later), at most
RESCUE_WAITING of them, kept in the checkpoint.

The replies that join stay marked as a peer's (ScoredCompletion.peer): the trainer's anchor and
importance weights act per reply (backends/microbatches.py), never on a peer's text as if it were
the node's own.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .reserved import MAX_REDRAWS, is_reserved
from .rollout import RIGHT, QuestionGroup
from .tasks import EVAL_SEED, Preset, Task, TaskError, regenerate

COMMON_SLOTS = 4  # questions per (swarm, preset, dataset, level, window): few, so that nodes meet
COMMON_WINDOW_S = 300  # a window of the common stream on the clock: several rounds of a CPU node
RESCUE_WAIT_ROUNDS = 2  # an own all-wrong group waits this long for a peer's right reply
RESCUE_WAITING = 8  # own groups waiting for a rescue, at most (the oldest go first)
RESCUE_REPLIES = 4  # right replies of peers joining one group, at most ...
RESCUE_REPLIES_PER_PEER = 2  # ... and from any one peer


def clock_window(now: float) -> int:
    """The common stream's window at time `now` (seconds since the epoch)."""
    return int(now // COMMON_WINDOW_S)


def common_task(preset: Preset, dataset: str, level: int, swarm: str, window: int, rng: np.random.Generator) -> Task:
    """A question of the common stream: one of COMMON_SLOTS drawn from `rng`, the slots the same
    on every node of `swarm` in `window`; a reserved held-out question is passed over."""
    key = f"{swarm}/{preset.name}/{dataset}/{level}/{window}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") % EVAL_SEED  # a training seed
    slot = int(rng.integers(COMMON_SLOTS))
    for attempt in range(MAX_REDRAWS):
        task = regenerate(preset.spec(dataset, level, seed, slot + attempt * COMMON_SLOTS))
        if not is_reserved(task, preset.name):
            return task
    raise TaskError(f"{dataset} at level {level}: no common question outside the held-out sets")


def awaits_rescue(group: QuestionGroup, common_questions: set[str]) -> bool:
    """An own group no reply of which is right, on a question of the common stream."""
    return group.source == "local" and not group.solved and group.task.question in common_questions


@dataclass
class Rescue:
    rescued: list[QuestionGroup] = field(default_factory=list)  # own groups with peers' right replies added
    still_waiting: list[QuestionGroup] = field(default_factory=list)
    by_peer: Counter = field(default_factory=Counter)  # right replies added, per peer


def rescue(waiting: Sequence[QuestionGroup], external: Sequence[QuestionGroup], round_no: int) -> Rescue:
    """Each waiting own group (its `sampled_round` set) that a peer's group on the same question
    has right replies for, with those replies added (bounded; one group a question, the newest:
    the same replies never count twice); the rest wait on while younger than RESCUE_WAIT_ROUNDS,
    the newest RESCUE_WAITING of them."""
    by_question: dict[str, list[QuestionGroup]] = {}
    for g in external:
        by_question.setdefault(g.task.question, []).append(g)
    result, done = Rescue(), set()
    for group in sorted(waiting, key=lambda g: g.sampled_round, reverse=True):
        question = group.task.question
        added = [] if question in done else _right_replies(by_question.get(question, ()))
        if added:
            result.rescued.append(replace(group, completions=group.completions + added))
            result.by_peer.update(c.peer for c in added)
            done.add(question)
        elif question not in done and round_no - group.sampled_round < RESCUE_WAIT_ROUNDS:
            result.still_waiting.append(group)
    result.still_waiting = sorted(result.still_waiting, key=lambda g: g.sampled_round)[-RESCUE_WAITING:]
    return result


def _right_replies(groups: Sequence[QuestionGroup]) -> list:
    replies, per_peer = [], Counter()
    for g in groups:
        for c in g.completions:
            if c.strict >= RIGHT and per_peer[g.source] < RESCUE_REPLIES_PER_PEER and len(replies) < RESCUE_REPLIES:
                replies.append(replace(c, peer=g.source, from_other_model=g.other_model))
                per_peer[g.source] += 1
    return replies

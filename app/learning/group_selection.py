"""SAPO's training-set builder: I local + J external question-groups per round.

Groups whose advantages are all zero teach nothing and are dropped first; the rest are sampled
uniformly. One peer may contribute at most `max_per_peer` external groups per round. When fewer
than J external groups are usable (no peers yet, or nothing with signal), local groups fill the
empty slots, so a lone node trains on I + J local groups — the paper's "training alone" baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .rollout import QuestionGroup


@dataclass
class Selection:
    local: list[QuestionGroup]
    external: list[QuestionGroup]

    @property
    def groups(self) -> list[QuestionGroup]:
        return self.local + self.external


def _uniform(groups: Sequence[QuestionGroup], k: int, rng: np.random.Generator) -> list[QuestionGroup]:
    if k >= len(groups):
        return list(groups)
    return [groups[i] for i in sorted(rng.choice(len(groups), size=k, replace=False))]


def select_groups(
    local: Sequence[QuestionGroup],
    external: Sequence[QuestionGroup],
    local_groups: int,
    external_groups: int,
    rng: np.random.Generator,
    max_per_peer: int | None = None,
) -> Selection:
    local_ok = [g for g in local if g.has_signal]
    external_ok = [g for g in external if g.has_signal]
    chosen_external: list[QuestionGroup] = []
    if external_groups and external_ok:
        order = rng.permutation(len(external_ok))
        per_peer: Counter[str] = Counter()
        for i in order:
            g = external_ok[int(i)]
            if max_per_peer is not None and per_peer[g.source] >= max_per_peer:
                continue
            chosen_external.append(g)
            per_peer[g.source] += 1
            if len(chosen_external) == external_groups:
                break
    local_take = local_groups + (external_groups - len(chosen_external))
    return Selection(_uniform(local_ok, local_take, rng), chosen_external)

"""SAPO's training-set builder: which of the round's own question-groups and which of peers' it
trains on.

Groups whose advantages are all zero teach nothing and are dropped first. One peer may
contribute at most `max_per_peer` external groups per round. Two ways to mix (`round.peer_groups`):

- **fill** (the default): every own group with signal is trained on, and peers' groups fill the
  places the own round left without signal, up to J of them: sharing never takes a node's own
  signal away. Where the own round has no more signal groups than I, this is the paper's mix.
- **mix** (the paper's, and `--design paper`): I local + J external, sampled uniformly; late in a
  run, when most own groups have signal, J of them give their place to peers' off-policy groups.

Either way, when fewer than J external groups are usable (no peers yet, or nothing with signal),
local groups take the empty places, so a lone node trains on all its own groups with signal, up
to I + J: the paper's "training alone" baseline.
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
    fill: bool = False,
) -> Selection:
    local_ok = [g for g in local if g.has_signal]
    external_ok = [g for g in external if g.has_signal]
    places = local_groups + external_groups
    if fill:  # every own group with signal first; peers' take the places left, at most J
        external_groups = min(external_groups, max(0, places - len(local_ok)))
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
    local_take = places - len(chosen_external)
    return Selection(_uniform(local_ok, local_take, rng), chosen_external)

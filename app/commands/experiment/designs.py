"""The experiment's designs: who trains on what, what is measured, and the defaults of each.

Every design holds its datasets at fixed levels (the curriculum off: round.levels), so the two arms
of a pair, which share a seed, draw the same questions and sampling seeds in every round (common
random numbers, learning/draws.py) and differ only in what they train on. Q is fixed (8 questions,
8 replies) and so is the minimum batch (the learning defaults'), the same in every arm.

- `specialists`: each node draws its local questions from one speciality (a dataset and level
  where the base model has some success to share: chosen at 10-17.5% on a first item set, levels
  0-1 pooled; on the design's own items 2.5-20%), all nodes are
  scored on every speciality. Arms: alone (8 local / 0 external), sharing (4 / 4), and alone with
  a uniform local mix over all specialities (8 / 0), which separates what sharing brings from
  mere diversity. Primary metric: held-out accuracy outside the node's own speciality.
- `rare-success`: identical nodes at levels where the base model's sampled replies (temperature 1)
  are right 2-5% of the time, so that only a minority of groups has a signal and one node's
  success can become every node's signal. Arms 8/0 and 4/4; primary: held-out accuracy there.
- `paper`: the paper's four mixes (8/0, 6/2, 4/4, 2/6) on identical nodes over all the specialities.
- `rescue`: identical nodes in the rare-success regime of starter-2 (levels of 1,000+ distinct
  questions where the base model's sampled replies are right 1.6-2.6 % of the time), 2 of 8
  questions a round from the common stream in every arm; arms alone, fill (4 / 4, peers' groups in
  the places left) and fill + rescue, and the paper's fixed 4 / 4 mix. Pre-registered in
  docs/rescue-experiment.md. Primary: held-out accuracy.
- `volunteer`: nodes alone on the default preset (starter-2), every dataset at its first level
  (each holds at least 1,000 distinct questions): the learning defaults' screen and what a
  volunteer's node learns, one arm. Primary: held-out accuracy, the mean over datasets.

Levels were chosen from the base model's rates measured here (docs/sharing.md, "Earlier").
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from statistics import fmean

from ...learning.reserved import RESERVED_AT_LEVEL

EXPERIMENT_ITEMS = 40  # held-out items per speciality in an experiment's evaluation (reserved: never trained on)


@dataclass(frozen=True)
class Arm:
    name: str
    local: int  # I and J in the paper's units of 8 (scaled to the round's Q)
    external: int
    uniform: bool = False  # local questions from every speciality (not the node's own alone)
    peer_groups: str = "fill"  # round.peer_groups: "fill", or the paper's fixed "mix"
    rescue: bool = False  # round.rescue: own all-wrong groups on common questions take peers' right replies

    def scaled(self, questions: int) -> tuple[int, int]:
        external = round(questions * self.external / (self.local + self.external))
        return questions - external, external


@dataclass(frozen=True)
class Design:
    name: str
    nodes: int
    rounds: int
    seeds: int
    burn_in: int  # evaluations after this round count (the format is learnt alone in ~10 rounds)
    eval_every: int
    specialities: tuple[tuple[str, int], ...]  # (dataset, level) in play
    arms: tuple[Arm, ...]
    specialists: bool = False  # node k draws its local questions from specialities[k] only
    baseline: str = "alone"
    metric: str = "held-out accuracy"
    eval_items: int = EXPERIMENT_ITEMS  # held-out items per speciality
    first_seed: int = 200  # its seeds by default (--seed-offset): none chose anything (TUNED_SEEDS)
    # further pairs (arm, against), compared by seed like every arm against the baseline
    contrasts: tuple[tuple[str, str], ...] = ()
    preset: str = "starter"  # the preset its specialities are levels of, whatever a node's default is
    # round.common_questions in every arm (rescue or not: common random numbers); 0 in the designs
    # that ran before the common stream existed, so that they draw what they drew
    common_questions: int = 0

    def __post_init__(self) -> None:
        if self.eval_items > RESERVED_AT_LEVEL:  # items past these could be trained on
            raise ValueError(f"design {self.name}: {self.eval_items} held-out items a speciality, "
                             f"{RESERVED_AT_LEVEL} are reserved from training (learning/reserved.py)")

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def focus(self, arm: Arm, node: int) -> tuple[tuple[str, ...], dict[str, int]]:
        """round.datasets and round.levels of node `node` in `arm`."""
        levels = dict(self.specialities)
        if self.specialists and not arm.uniform:
            dataset, level = self.specialities[node % len(self.specialities)]
            return (dataset,), {dataset: level}
        return tuple(levels), levels

    def primary(self, node: int, per_dataset: Mapping[str, float], leaving_out: Collection[str] = ()) -> float:
        """The node's primary metric from its per-speciality held-out accuracy (`leaving_out`: a
        sensitivity analysis without some specialities; NaN where none is left)."""
        datasets = [d for d, _ in self.specialities if d not in leaving_out]
        if self.specialists:
            own = self.specialities[node % len(self.specialities)][0]
            datasets = [d for d in datasets if d != own]
        return fmean(per_dataset[d] for d in datasets) if datasets else math.nan

    def eval_rounds(self, rounds: int | None = None) -> list[int]:
        """The rounds after which every node is evaluated (0: the base model, shared), the last
        round always among them."""
        rounds = rounds or self.rounds
        return sorted({0, *range(self.eval_every, rounds + 1, self.eval_every), rounds})

    def counted(self, round_no: int) -> bool:
        return round_no > self.burn_in


# The base model's rates on the starter preset, measured when the levels were chosen (not committed;
# each grid's own base.json holds the base model's score on its items):
# near-greedy on 40 held-out items at levels 0-1 pooled (the set the levels were chosen on),
# letter_counting 17.5%, basic_arithmetic 10%, chain_sum 10% (the others 0-2.5%: no signal to
# share); on the specialists' own items at level 0 (its base.json) 10%, 20% and 2.5%; sampled at
# temperature 1 (24 questions x 8 replies), chain_sum 2.1% at level 0, 1.6% at level 1, 1.0% at
# level 2. letter_counting's answer is "1" on 65% of its level-0 items: a shortcut (report.py).
# Seeds that chose the learning defaults (1, 2, 101) or reported them (3-6): an experiment's own start higher.
# 610-619: the k2 anchor's defaults screen (2026-11-28, assets/results/defaults-screen).
TUNED_SEEDS = frozenset({1, 2, 3, 4, 5, 6, 101, *range(610, 620)})

SPECIALITIES = (("letter_counting", 0), ("basic_arithmetic", 0), ("chain_sum", 0))
RARE_LEVELS = (("chain_sum", 0),)
# starter-2's rare-success levels (its header: sampled at T=1, 2.6 % and 1.6 % right)
RESCUE_LEVELS = (("chain_sum", 0), ("base_conversion", 0))
# starter-2's datasets at level 0 (assets/presets/starter-2.toml: its survey of the base model)
VOLUNTEER_LEVELS = tuple((dataset, 0) for dataset in (
    "chain_sum", "basic_arithmetic", "base_conversion", "simple_equations", "leg_counting", "decimal_chain_sum"))

DESIGNS = {
    # specialists and rare-success ran (assets/results/) with the paper's fixed mix, and keep it.
    "specialists": Design(
        "specialists", nodes=3, rounds=30, seeds=5, burn_in=10, eval_every=5, specialities=SPECIALITIES,
        arms=(Arm("alone", 8, 0, peer_groups="mix"), Arm("sharing", 4, 4, peer_groups="mix"),
              Arm("alone-uniform", 8, 0, uniform=True, peer_groups="mix")),
        specialists=True, metric="held-out accuracy outside the node's speciality", first_seed=300,
        # what sharing adds beyond mere diversity: the reason the uniform arm exists
        contrasts=(("sharing", "alone-uniform"),)),
    "rare-success": Design(
        "rare-success", nodes=3, rounds=30, seeds=5, burn_in=10, eval_every=5, specialities=RARE_LEVELS,
        arms=(Arm("alone", 8, 0, peer_groups="mix"), Arm("sharing", 4, 4, peer_groups="mix")), first_seed=200),
    "paper": Design(
        "paper", nodes=4, rounds=30, seeds=5, burn_in=10, eval_every=5, specialities=SPECIALITIES,
        arms=tuple(Arm(name, i, j, peer_groups="mix") for name, i, j in
                   (("alone", 8, 0), ("6/2", 6, 2), ("4/4", 4, 4), ("2/6", 2, 6))), first_seed=400),
    "rescue": Design(
        "rescue", nodes=4, rounds=60, seeds=8, burn_in=20, eval_every=10, specialities=RESCUE_LEVELS,
        arms=(Arm("alone", 8, 0), Arm("fill", 4, 4), Arm("fill+rescue", 4, 4, rescue=True),
              Arm("paper-4/4", 4, 4, peer_groups="mix")),
        first_seed=800, preset="starter-2", common_questions=2, contrasts=(("fill+rescue", "fill"),)),
    "volunteer": Design(
        "volunteer", nodes=1, rounds=60, seeds=5, burn_in=10, eval_every=10, specialities=VOLUNTEER_LEVELS,
        arms=(Arm("alone", 8, 0),), first_seed=700, preset="starter-2"),
}

"""The node's own sense of difficulty: per dataset, a level and the outcomes of its recent groups;
and its tag rate.

GRPO learns only from *mixed* groups (some replies right, some wrong): a group all right or all
wrong has no advantage. So the curriculum aims each dataset at a level where most groups are mixed
(roughly 40-80%), as a small state machine over the last `WINDOW` groups at the dataset's level:

- **up** a level once `MIN_GROUPS` have been seen there and at least `UP_ALL_RIGHT` of the recent
  groups were all right (too easy: no signal left);
- **down** a level once at least `DOWN_ALL_WRONG` of them were all wrong (too hard: nothing to
  learn from, and the old rule waited for 12 groups at a success under 5%, picked rarely, while
  the dataset gave no signal for dozens of rounds);
- otherwise it stays. A level's window starts empty at every move.

Picks: a dataset is chosen with weight `WEIGHT_FLOOR` + its recent mixed share (`NEW_LEVEL_MIXED`
until two groups are in), so the datasets that teach come up most and none starves (a dataset
stuck at level 0 with nothing right is still asked about, at the floor's rate, to notice when it
starts to succeed). `REPLAY_SHARE` of a dataset's questions come from the levels below its own
(uniformly), so what was learnt there keeps being practised; their groups train as usual but do not
move the current level.

A node may be focused (`focus`: round.datasets, round.levels): local questions only from some
datasets (a specialist), some of them at fixed levels. A fixed level never moves and has no
replay; when every dataset drawn is fixed, datasets are picked uniformly: the curriculum is off,
as an experiment needs so that the two arms of a pair draw the same questions in every round.

The tag rate (share of replies with a closed <answer> tag) scales the fading format bonus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .rollout import RIGHT  # a strict score that counts as right (partial credit below it does not)
from .tasks import Preset

EMA = 0.25  # the tag rate's, and the displayed success's
WINDOW = 8
MIN_GROUPS = 4
UP_ALL_RIGHT = 0.5
DOWN_ALL_WRONG = 0.75
WEIGHT_FLOOR = 0.2
NEW_LEVEL_MIXED = 0.5
REPLAY_SHARE = 0.25

ALL_RIGHT, ALL_WRONG, MIXED = "right", "wrong", "mixed"


def group_outcome(strict: Sequence[float]) -> str:
    """A group's class by its replies' strict scores: all right, all wrong (no reply differs from
    the others and none is right), or mixed (they differ: an advantage to learn from)."""
    if min(strict) >= RIGHT:
        return ALL_RIGHT
    return MIXED if max(strict) > min(strict) else ALL_WRONG


@dataclass
class DatasetProgress:
    level: int = 0
    recent: list[str] = field(default_factory=list)  # outcomes of the latest groups at this level
    success: float = 0.0  # EMA of the strict reward at this level (shown to the user)
    groups: int = 0  # groups seen at this level

    def share(self, outcome: str) -> float:
        return self.recent.count(outcome) / len(self.recent) if self.recent else 0.0

    @property
    def mixed_share(self) -> float:
        return self.share(MIXED) if len(self.recent) >= 2 else NEW_LEVEL_MIXED


@dataclass
class Curriculum:
    preset: Preset
    progress: dict[str, DatasetProgress] = field(default_factory=dict)
    tag_rate: float = 0.0
    drawn: tuple[str, ...] = ()  # the datasets local questions come from (the focus; all when empty)
    fixed: dict[str, int] = field(default_factory=dict)  # datasets held at a level (the focus)

    def __post_init__(self) -> None:
        for name in self.preset.datasets:
            self.progress.setdefault(name, DatasetProgress())
        # A preset may have been edited since the state was saved: drop what it no longer has.
        for name in list(self.progress):
            if name not in self.preset.levels:
                del self.progress[name]
            else:
                top = len(self.preset.levels[name]) - 1
                self.progress[name].level = min(self.progress[name].level, top)

    def focus(self, datasets: tuple[str, ...] = (), levels: dict[str, int] | None = None) -> Curriculum:
        """Draw only from `datasets` (all when empty), holding `levels` fixed; ValueError naming what
        the preset does not have."""
        for name in (*datasets, *(levels or {})):
            if name not in self.preset.levels:
                raise ValueError(f"dataset {name!r} is not in preset {self.preset.name!r} "
                                 f"({', '.join(self.preset.datasets)})")
        for name, level in (levels or {}).items():
            if not 0 <= level < len(self.preset.levels[name]):
                raise ValueError(f"{name} has levels 0-{len(self.preset.levels[name]) - 1} in preset {self.preset.name!r}")
            self.progress[name] = DatasetProgress(level=level) if self.progress[name].level != level else self.progress[name]
        self.drawn, self.fixed = tuple(datasets), dict(levels or {})
        return self

    @property
    def datasets(self) -> tuple[str, ...]:
        return self.drawn or self.preset.datasets

    def weights(self) -> np.ndarray:
        """Of `datasets`: uniform when every one is fixed (the curriculum off), else by mixed share."""
        if all(d in self.fixed for d in self.datasets):
            return np.full(len(self.datasets), 1 / len(self.datasets))
        w = np.array([WEIGHT_FLOOR + self.progress[d].mixed_share for d in self.datasets])
        return w / w.sum()

    def pick(self, rng: np.random.Generator, n: int) -> list[tuple[str, int]]:
        """`n` (dataset, level) picks: datasets by weight, a replay share from the levels below."""
        names = self.datasets
        chosen = rng.choice(len(names), size=n, replace=n > len(names), p=self.weights())
        replay = rng.random(n) < REPLAY_SHARE
        below = rng.random(n)
        picks = []
        for i, again, u in zip(chosen, replay, below):
            level = self.progress[names[i]].level
            again = again and names[i] not in self.fixed
            picks.append((names[i], int(u * level) if again and level > 0 else level))
        return picks

    def format_bonus(self, base: float) -> float:
        return base * (1.0 - self.tag_rate)

    def record(self, dataset: str, level: int, strict: Sequence[float]) -> None:
        """A scored group of `dataset` at `level` (its replies' strict scores)."""
        prog = self.progress[dataset]
        if level != prog.level:  # a replay from below, or sampled before a level change
            return
        fixed = dataset in self.fixed
        mean = float(np.mean(strict))
        prog.success = mean if prog.groups == 0 else (1 - EMA) * prog.success + EMA * mean
        prog.groups += 1
        prog.recent = [*prog.recent, group_outcome(strict)][-WINDOW:]
        top = len(self.preset.levels[dataset]) - 1
        if len(prog.recent) < MIN_GROUPS or fixed:
            return
        if prog.share(ALL_RIGHT) >= UP_ALL_RIGHT and prog.level < top:
            self.progress[dataset] = DatasetProgress(level=prog.level + 1)
        elif prog.share(ALL_WRONG) >= DOWN_ALL_WRONG and prog.level > 0:
            self.progress[dataset] = DatasetProgress(level=prog.level - 1)

    def record_tag_rate(self, rate: float) -> None:
        self.tag_rate = (1 - EMA) * self.tag_rate + EMA * rate

    def levels(self) -> dict[str, int]:
        return {d: p.level for d, p in self.progress.items()}

    def to_dict(self) -> dict:
        return {"preset": self.preset.name, "tag_rate": self.tag_rate, "progress": {k: asdict(v) for k, v in self.progress.items()}}

    @classmethod
    def from_dict(cls, preset: Preset, data: dict | None) -> Curriculum:
        """The saved state; a checkpoint of an earlier version (no `recent` outcomes) keeps its
        levels and judges them afresh."""
        if not data or data.get("preset") != preset.name:
            return cls(preset)
        fields = set(DatasetProgress.__dataclass_fields__)
        progress = {k: DatasetProgress(**{f: v for f, v in p.items() if f in fields})
                    for k, p in data.get("progress", {}).items()}
        return cls(preset, progress, float(data.get("tag_rate", 0.0)))

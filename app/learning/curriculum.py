"""The node's own sense of difficulty: per-dataset level and success rate, and its tag rate.

- Tasks are picked with weight 0.25 + 4·p(1-p) (p = the dataset's recent success): datasets at
  the edge of the model's ability, where groups have both right and wrong answers and so an
  advantage to learn from, come up most; none is starved.
- A dataset moves up a level when its recent success reaches 0.6 and down when it stays under
  0.05, so difficulty follows the node's success rate.
- The tag rate (share of replies with a closed <answer> tag) scales the fading format bonus.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .tasks import Preset

EMA = 0.25
LEVEL_UP_AT = 0.6
LEVEL_DOWN_BELOW = 0.05
MIN_GROUPS_UP = 4
MIN_GROUPS_DOWN = 12
NEW_LEVEL_PRIOR = 0.5  # the success a level is assumed to have until its first group is scored


@dataclass
class DatasetProgress:
    level: int = 0
    success: float = 0.0  # EMA of the strict reward of this dataset's groups at this level
    groups: int = 0  # groups seen at this level


@dataclass
class Curriculum:
    preset: Preset
    progress: dict[str, DatasetProgress] = field(default_factory=dict)
    tag_rate: float = 0.0

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

    def weights(self) -> np.ndarray:
        p = np.array([self.progress[d].success for d in self.preset.datasets])
        w = 0.25 + 4.0 * p * (1.0 - p)
        return w / w.sum()

    def pick(self, rng: np.random.Generator, n: int) -> list[tuple[str, int]]:
        names = self.preset.datasets
        chosen = rng.choice(len(names), size=n, replace=n > len(names), p=self.weights())
        return [(names[i], self.progress[names[i]].level) for i in chosen]

    def format_bonus(self, base: float) -> float:
        return base * (1.0 - self.tag_rate)

    def record(self, dataset: str, level: int, strict_mean: float) -> None:
        prog = self.progress[dataset]
        if level != prog.level:  # a group sampled before a level change: no longer informative
            return
        prog.success = strict_mean if prog.groups == 0 else (1 - EMA) * prog.success + EMA * strict_mean
        prog.groups += 1
        top = len(self.preset.levels[dataset]) - 1
        # A new level starts at NEW_LEVEL_PRIOR, not 0: at 0 it would be picked ~5x less than a
        # dataset at the edge of the model's ability just when it becomes interesting. Its first
        # group replaces the prior.
        if prog.success >= LEVEL_UP_AT and prog.groups >= MIN_GROUPS_UP and prog.level < top:
            self.progress[dataset] = DatasetProgress(level=prog.level + 1, success=NEW_LEVEL_PRIOR)
        elif prog.success < LEVEL_DOWN_BELOW and prog.groups >= MIN_GROUPS_DOWN and prog.level > 0:
            self.progress[dataset] = DatasetProgress(level=prog.level - 1, success=NEW_LEVEL_PRIOR)

    def record_tag_rate(self, rate: float) -> None:
        self.tag_rate = (1 - EMA) * self.tag_rate + EMA * rate

    def levels(self) -> dict[str, int]:
        return {d: p.level for d, p in self.progress.items()}

    def to_dict(self) -> dict:
        return {"preset": self.preset.name, "tag_rate": self.tag_rate, "progress": {k: asdict(v) for k, v in self.progress.items()}}

    @classmethod
    def from_dict(cls, preset: Preset, data: dict | None) -> Curriculum:
        if not data or data.get("preset") != preset.name:
            return cls(preset)
        progress = {k: DatasetProgress(**v) for k, v in data.get("progress", {}).items()}
        return cls(preset, progress, float(data.get("tag_rate", 0.0)))

"""The node's best weights so far: the checkpoint whose held-out accuracy (the fixed set) is the
highest of its evaluations, kept in `checkpoints/best/` beside the rotating round folders (which
keep only the newest few), for `swarmling eval --best`, `export --best` and `reset --best`.

No automatic rollback to it: one evaluation's accuracy moves by ±2 standard errors between two
evaluations of equally good weights about one time in twenty (and a difference of two noisy
scores is noisier still), so rolling back on a drop would throw away real learning as often as it
caught a collapse; with the learning defaults no run here dropped that far after round 30. The
volunteer sees "best 31% at round 120" and can go back to it by hand (`swarmling reset --best`).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...backends.atomic import atomic_folder
from .checkpoint import CheckpointError, verify

log = logging.getLogger(__name__)

BEST_FOLDER = "best"


@dataclass(frozen=True)
class Best:
    accuracy: float
    round: int


def best_folder(checkpoints: Path) -> Path:
    return checkpoints / BEST_FOLDER


def read_best(checkpoints: Path, preset: str | None = None) -> Best | None:
    """The best checkpoint's score and round; None when there is none (or it is damaged), and,
    given `preset`, when it was measured on another preset's held-out set (not comparable)."""
    folder = best_folder(checkpoints)
    if not folder.is_dir():
        return None
    try:
        record = verify(folder).state.get("metrics") or {}
    except CheckpointError as exc:
        log.warning("the best checkpoint is damaged (%s): the next evaluation replaces it", exc)
        return None
    if record.get("eval_accuracy") is None or record.get("eval_of_round") != record.get("round"):
        return None
    if preset is not None and record.get("preset") not in (None, "", preset):
        return None
    return Best(float(record["eval_accuracy"]), int(record["round"]))


class BestKeeper:
    def __init__(self, checkpoints: Path, preset: str | None = None) -> None:
        self.checkpoints = checkpoints
        self.best = read_best(checkpoints, preset)  # one kept on another preset is replaced by the next

    def improves(self, accuracy: float, weights_round: int) -> bool:
        """Whether the weights of `weights_round` (trained weights, not the base model's) beat the best."""
        return weights_round > 0 and (self.best is None or accuracy > self.best.accuracy)

    def keep(self, round_folder: Path, accuracy: float, weights_round: int) -> None:
        """Copy the round's checkpoint (already written, with its evaluation in its record) as the best."""
        with atomic_folder(best_folder(self.checkpoints), fsync=True, prefix=".best-") as tmp:
            shutil.copytree(round_folder, tmp, dirs_exist_ok=True)
        self.best = Best(accuracy, weights_round)

"""Which checkpoint an export (or `ask`) reads, taken as a verified copy.

A running node keeps only its newest few round folders and replaces `best/` when an evaluation
beats it, so the folder named at the start may be pruned or replaced while it is read. Copying
first and checking the copy against its manifest (node/checkpoint.copy_checkpoint) never stops
the node; when the newest folder goes away mid-copy, the then-newest is taken instead. A folder
named by the user is refused when damaged: exporting something else silently would be worse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import NodeError
from .best import best_folder, read_best
from .checkpoint import Checkpoint, CheckpointError, copy_checkpoint, latest_checkpoint
from .resume import NodeState

# The newest folder can be pruned while it is copied only when the node finishes a round meanwhile:
# a few tries are plenty (a round takes seconds, a copy milliseconds).
NEWEST_TRIES = 3


@dataclass(frozen=True)
class TakenCheckpoint:
    source: Path  # the folder it was copied from
    copy: Checkpoint  # the verified copy
    state: NodeState

    @property
    def round(self) -> int:
        return self.copy.round

    @property
    def metrics_file(self) -> Path:
        """The metrics log of the home the checkpoint came from (<state>/checkpoints/<folder>)."""
        return self.source.resolve().parent.parent / "metrics.jsonl"


def take_checkpoint(checkpoints: Path, folder: Path | None, best: bool, model_name: str, into: Path) -> TakenCheckpoint:
    """A verified copy at `into` of `folder`, the home's best (`best`) or its newest checkpoint;
    NodeError saying why when there is none, it is damaged, or it was trained on another model."""
    if folder is not None:
        taken = _copy(Path(folder), into, f"{folder} is not an intact swarmling checkpoint")
    elif best:
        if read_best(checkpoints) is None:
            raise NodeError(f"no best checkpoint in {checkpoints} yet (the node keeps one from its first held-out "
                            "evaluation on)")
        taken = _copy(best_folder(checkpoints), into, "the best checkpoint is damaged")
    else:
        taken = _newest(checkpoints, into)
    if taken.state.model != model_name:
        raise NodeError(f"{taken.source} was trained on model {taken.state.model!r}, not {model_name!r}: "
                        f"add --model {taken.state.model}")
    return taken


def _newest(checkpoints: Path, into: Path) -> TakenCheckpoint:
    for _ in range(NEWEST_TRIES):
        newest = latest_checkpoint(checkpoints)
        if newest is None:
            raise NodeError(f"no checkpoint in {checkpoints}: the node writes one after each round")
        try:
            return _copy(newest.path, into, "")
        except _Changed:
            continue
    raise NodeError(f"the checkpoints in {checkpoints} kept changing while they were copied; try again")


class _Changed(NodeError):
    pass


def _copy(folder: Path, into: Path, refusal: str) -> TakenCheckpoint:
    if not folder.is_dir():
        raise NodeError(f"no checkpoint folder at {folder}")
    try:
        copy = copy_checkpoint(folder, into)
    except CheckpointError as exc:
        if refusal:
            raise NodeError(f"{refusal} ({exc}): nothing was exported") from None
        raise _Changed(str(exc)) from None
    return TakenCheckpoint(folder, copy, NodeState.of(copy))

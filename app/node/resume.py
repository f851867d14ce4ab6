"""Where a node starts from: the newest intact checkpoint, or a fresh seed; and what a round's
checkpoint holds besides the backend's own files (adapter, optimizer)."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ...backends.base import Backend
from .checkpoint import Checkpoint, latest_checkpoint, save_checkpoint
from ..learning.curriculum import Curriculum
from ..errors import NodeError
from ..learning.round_record import RoundRecord
from ..events import Listener, Notice
from ..learning.rollout import QuestionGroup
from ..learning.tasks import Preset, TaskError

STATE_VERSION = 1
# The learning rules a checkpoint was trained under. 2: the minimum batch, warmup, the KL anchor
# and the curriculum that aims at mixed groups (issue "learning that holds"); 1 (absent): before.
LEARNING_VERSION = 2


class NodeState(msgspec.Struct, kw_only=True, frozen=True):
    """What a round's checkpoint holds of the node itself (`state.json`, beside the backend's
    adapter and optimizer): enough to go on exactly where it stopped."""

    version: int = STATE_VERSION
    learning: int = 1  # LEARNING_VERSION when written; absent in an earlier version's checkpoints
    round: int
    seed: int
    model: str
    # numpy's bit generator state, where an earlier version kept one generator for every draw; each
    # round's draws now come from (seed, round): nothing to save (learning/draws.py)
    rng: dict | None = None
    curriculum: dict | None = None  # learning/curriculum.py's to_dict()
    # Groups selected for training, waiting for the minimum batch (rollout.QuestionGroup.to_state):
    # kept, so a restart loses none of the work that went into them.
    waiting: list[dict] = msgspec.field(default_factory=list)
    # Own all-wrong groups on the common stream's questions, waiting for a peer's right reply
    # (learning/rescue.py); absent in an earlier version's checkpoints.
    awaiting_rescue: list[dict] = msgspec.field(default_factory=list)
    metrics: dict | None = None  # the round's record, as metrics.jsonl has it

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> NodeState:
        try:
            return msgspec.convert(checkpoint.state, cls)
        except msgspec.ValidationError as exc:
            raise NodeError(f"{checkpoint.path} is not a swarmling node's checkpoint ({exc}): move it away, "
                            "or use another --home") from None


@dataclass(frozen=True)
class StartPoint:
    seed: int
    checkpoint: Checkpoint | None  # None: a fresh start
    state: NodeState | None = None

    @property
    def round(self) -> int:
        return self.checkpoint.round if self.checkpoint is not None else 0

    @property
    def saved_record(self) -> dict | None:
        """The metrics record saved with the checkpoint, as written (for the metrics log)."""
        return self.state.metrics if self.state is not None else None


def find_start(checkpoints: Path, model_name: str, configured_seed: int | None) -> StartPoint:
    """Resume from the newest checkpoint (which must be of this model), else start on a new seed."""
    checkpoint = latest_checkpoint(checkpoints)
    if checkpoint is None:
        seed = configured_seed if configured_seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        return StartPoint(seed, None)
    state = NodeState.of(checkpoint)
    if state.model != model_name:
        raise NodeError(
            f"the checkpoints in {checkpoints} were trained on model {state.model!r}, not "
            f"{model_name!r}: run with --model {state.model}, or use another --home for the new model"
        )
    return StartPoint(state.seed, checkpoint, state)


def restore(start: StartPoint, backend: Backend, preset: Preset,
            emit: Listener) -> tuple[Curriculum, list[QuestionGroup], list[QuestionGroup]]:
    """Load the checkpoint's adapter and optimizer; returns the curriculum, the groups that were
    waiting for a training step and those waiting for a rescue."""
    if start.checkpoint is None:
        return Curriculum(preset), [], []
    try:
        if start.state.learning < LEARNING_VERSION:
            # Trained under the earlier rules (a constant, larger step, no anchor): the adapter is
            # kept, AdamW starts afresh (its moments were shaped by those steps) and warms up again.
            backend.load_adapter(start.checkpoint.path)
            emit(Notice("info", f"resuming round {start.round}'s adapter under the new learning defaults (minimum batch, "
                                "warmup, KL anchor): the optimizer starts afresh. `swarmling reset` starts again from "
                                "the base model instead"))
        else:
            backend.load_state(start.checkpoint.path)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise NodeError(
            f"could not resume from {start.checkpoint.path}: {exc}. Restore the matching [train] settings, "
            "or use another --home to start fresh"
        ) from exc
    return (Curriculum.from_dict(preset, start.state.curriculum),
            _waiting_groups(start.state.waiting, "a training step", emit),
            _waiting_groups(start.state.awaiting_rescue, "a rescue", emit))


def _waiting_groups(saved: list[dict], what: str, emit: Listener) -> list[QuestionGroup]:
    try:
        return [QuestionGroup.from_state(g) for g in saved]
    except (TaskError, KeyError, TypeError, ValueError) as exc:  # a reasoning-gym or preset that changed
        emit(Notice("warning", f"the {len(saved)} groups waiting for {what} could not be restored ({exc}): "
                               "dropped, the next rounds collect new ones"))
        return []


def write_checkpoint(
    root: Path,
    round_no: int,
    *,
    seed: int,
    model: str,
    curriculum: Curriculum,
    waiting: Sequence[QuestionGroup],
    awaiting_rescue: Sequence[QuestionGroup] = (),
    record: RoundRecord,
    save_backend: Callable[[Path], None],
    keep: int,
    last_good_round: int,
) -> None:
    state = NodeState(learning=LEARNING_VERSION, round=round_no, seed=seed, model=model,
                      curriculum=curriculum.to_dict(), waiting=[g.to_state() for g in waiting],
                      awaiting_rescue=[g.to_state() for g in awaiting_rescue], metrics=record.to_dict())
    try:
        save_checkpoint(root, round_no, msgspec.to_builtins(state), save_backend, keep)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NodeError(
                f"disk full while saving round {round_no} to {root}: free some space and "
                f"restart; the checkpoint of round {last_good_round} is intact"
            ) from exc
        raise NodeError(f"could not save the checkpoint of round {round_no}: {exc}") from exc

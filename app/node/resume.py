"""Where a node starts from: the newest intact checkpoint, or a fresh seed; and what a round's
checkpoint holds besides the backend's own files (adapter, optimizer)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...backends.base import Backend
from .checkpoint import Checkpoint, latest_checkpoint, save_checkpoint
from ..learning.curriculum import Curriculum
from ..errors import NodeError
from ..learning.round_record import RoundRecord
from ..learning.tasks import Preset

STATE_VERSION = 1


@dataclass(frozen=True)
class StartPoint:
    seed: int
    checkpoint: Checkpoint | None  # None: a fresh start

    @property
    def round(self) -> int:
        return self.checkpoint.round if self.checkpoint is not None else 0

    @property
    def saved_record(self) -> dict | None:
        """The metrics record saved with the checkpoint, as written (for the metrics log)."""
        return self.checkpoint.state.get("metrics") if self.checkpoint is not None else None


def find_start(checkpoints: Path, model_name: str, configured_seed: int | None) -> StartPoint:
    """Resume from the newest checkpoint (which must be of this model), else start on a new seed."""
    checkpoint = latest_checkpoint(checkpoints)
    if checkpoint is None:
        seed = configured_seed if configured_seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        return StartPoint(seed, None)
    saved_model = checkpoint.state.get("model")
    if saved_model != model_name:
        raise NodeError(
            f"the checkpoints in {checkpoints} were trained on model {saved_model!r}, not "
            f"{model_name!r}: run with --model {saved_model}, or use another --home for the new model"
        )
    return StartPoint(int(checkpoint.state["seed"]), checkpoint)


def restore(start: StartPoint, backend: Backend, rng: np.random.Generator, preset: Preset) -> Curriculum:
    """Load the checkpoint's adapter and optimizer, put the RNG back; returns the curriculum."""
    if start.checkpoint is None:
        return Curriculum(preset)
    try:
        backend.load_state(start.checkpoint.path)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise NodeError(
            f"could not resume from {start.checkpoint.path}: {exc}. Restore the matching [train] settings, "
            "or use another --home to start fresh"
        ) from exc
    rng.bit_generator.state = start.checkpoint.state["rng"]
    return Curriculum.from_dict(preset, start.checkpoint.state.get("curriculum"))


def write_checkpoint(
    root: Path,
    round_no: int,
    *,
    seed: int,
    model: str,
    rng: np.random.Generator,
    curriculum: Curriculum,
    record: RoundRecord,
    save_backend: Callable[[Path], None],
    keep: int,
    last_good_round: int,
) -> None:
    state = {
        "version": STATE_VERSION,
        "round": round_no,
        "seed": seed,
        "model": model,
        "rng": rng.bit_generator.state,
        "curriculum": curriculum.to_dict(),
        "metrics": record.to_dict(),
    }
    try:
        save_checkpoint(root, round_no, state, save_backend, keep)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NodeError(
                f"disk full while saving round {round_no} to {root}: free some space and "
                f"restart; the checkpoint of round {last_good_round} is intact"
            ) from exc
        raise NodeError(f"could not save the checkpoint of round {round_no}: {exc}") from exc

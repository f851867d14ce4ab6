"""`swarmling reset [--best]`: start again from the base model, or from the best checkpoint.

Nothing is deleted: the checkpoints and the metrics log move into `<state>/archive/<time>/`. The
node's identity, the peers it knows, its config and the converted model stay where they are, so
it rejoins its swarm as the same peer. With `--best` the best checkpoint becomes the newest round
again (and the metrics log is cut back to it): the node resumes from the weights that scored best.
Refused while the node runs (it holds its state dir's lock).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..errors import NodeError
from ..metrics import archives, read_records, write_records
from ..node.best import best_folder, read_best
from ..node.checkpoint import round_folder
from ..node.state_lock import StateDirLock
from ..paths import Paths
from .arguments import Invocation


def reset_command(paths: Paths, to_best: bool) -> int:
    lock = StateDirLock(paths.ensure().state_dir)
    lock.acquire()  # NodeError (with what to do) while the node runs
    try:
        best = read_best(paths.checkpoints) if to_best else None
        if to_best and best is None:
            raise NodeError(f"no best checkpoint in {paths.checkpoints} (the node keeps one from its first held-out "
                            "evaluation on; an earlier version kept none): `swarmling reset` starts again from the base "
                            "model")
        archive = _archive(paths, keep_best=to_best)
        if best is not None:
            shutil.copytree(best_folder(paths.checkpoints), round_folder(paths.checkpoints, best.round))
            kept = [r for r in read_records(archive / paths.metrics_file.name) if r["round"] <= best.round]
            write_records(paths.metrics_file, kept)
            print(f"swarmling: the node resumes from its best checkpoint: round {best.round}, held-out "
                  f"{best.accuracy:.1%}; everything else is in {archive}")
        else:
            print(f"swarmling: the node starts again from the base model; its checkpoints and metrics are in {archive}")
        print("  identity, known peers and config are unchanged")
    finally:
        lock.release()
    return 0


def _archive(paths: Paths, keep_best: bool) -> Path:
    archive = paths.state_dir / "archive" / time.strftime("%Y%m%d-%H%M%S")
    archive.mkdir(parents=True)
    if paths.checkpoints.exists():
        shutil.move(paths.checkpoints, archive / paths.checkpoints.name)
        if keep_best and (archive / paths.checkpoints.name / best_folder(paths.checkpoints).name).exists():
            paths.checkpoints.mkdir()
            shutil.copytree(archive / paths.checkpoints.name / best_folder(paths.checkpoints).name,
                            best_folder(paths.checkpoints))
    for part in [*archives(paths.metrics_file), paths.metrics_file]:  # the rolled parts too (metrics.py)
        if part.exists():
            shutil.move(part, archive / part.name)
    return archive


def reset_arguments(p) -> None:
    p.add_argument("--best", action="store_true", help="resume from the checkpoint with the best held-out accuracy")


def reset_main(c: Invocation) -> int:
    return reset_command(c.paths, c.args.best)

"""What of an experiment crosses between machines: the results of its finished runs, small enough
to carry (`--archive FILE`, read before the grid and written anew after it).

A GPU machine lent by the quarter hour starts bare and takes at most 64 MiB a call, and a node's
weights and optimizer are ~60 MB: they stay behind. So the archive holds, for each (arm, seed)
whose every node has all its evaluations, the evaluations, the round records and the memory
reading (what `summarise` reads), plus the shared base scores and the outputs. A run cut short
is left out and reruns from its first round on the next machine; the common random numbers make
that rerun draw the same questions and seeds.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from ....backends.atomic import atomic_file
from .grid import CPU_FILE, EVALS_FILE, RESUMES_FILE, EvalLog, ExperimentOptions

OUTPUTS = ("base.json", "plan.json", "invocations.jsonl", "summary.json", "table.md", "experiment.png", "experiment.svg")
NODE_FILES = (EVALS_FILE, "state/metrics.jsonl", CPU_FILE)


def finished_files(options: ExperimentOptions) -> list[Path]:
    """The files that carry the grid's results so far, relative to `options.out`."""
    out, schedule = options.out, options.design.eval_rounds(options.rounds)
    files = [Path(name) for name in OUTPUTS if (out / name).exists()]
    for seed in options.seed_values:
        for arm in options.design.arms:
            run = options.run_dir(arm, seed)
            nodes = [run / f"node-{k}" for k in range(options.nodes)]
            if not all(EvalLog(node / EVALS_FILE).done(schedule) for node in nodes):
                continue
            wanted = [node / name for node in nodes for name in NODE_FILES] + [run / "memory.json", run / RESUMES_FILE]
            files += [path.relative_to(out) for path in wanted if path.exists()]
    return files


def pack(options: ExperimentOptions, archive: Path) -> int:
    """Write the archive of the finished runs (atomically); returns how many files it holds."""
    files = finished_files(options)
    with atomic_file(archive) as tmp, tarfile.open(tmp, mode="w:gz") as tar:
        for name in files:
            tar.add(options.out / name, arcname=str(name))
    return len(files)


def unpack(archive: Path, out: Path) -> int:
    """Restore the finished runs carried in `archive` into `out`; files already there are kept
    (a warm machine's own copy is the same or newer). Returns how many files were restored."""
    out.mkdir(parents=True, exist_ok=True)
    restored = 0
    with tarfile.open(archive, mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and not (out / member.name).exists():
                tar.extract(member, out, filter="data")  # "data": no absolute paths, links or escapes
                restored += 1
    return restored

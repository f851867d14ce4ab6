"""The rescue grid's internal pilot (docs/rescue-experiment.md, "The pilot's reading"): after the
first 5 pairs, the paired SD of the primary comparison (fill + rescue - fill) across seeds, and the
number of pairs it sets; never a mean score or a mean difference. Also each arm's CPU seconds a
node-round (rounds 2-60), the cost the issue bounds at 1.3x alone.

    python assets/results/rescue-grid/pairs_sd.py [FOLDER]

FOLDER holds the committed `SEED-ARM.tar.gz` archives (default: this script's folder). It refuses
to run before seeds 800-804 have all three arms: the pre-registration reads the SD once, there.
"""

import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

from swarmling.app.commands.experiment.statistics import detectable_effect

SEEDS = range(800, 805)
ARMS = ("alone", "fill", "fill+rescue")
PRIMARY = ("fill+rescue", "fill")
COUNTED_EVALS = (30, 40, 50, 60)  # after the 20-round burn-in
TARGET_POINTS, FEWEST, MOST = 5.0, 5, 14


def archive(folder: Path, seed: int, arm: str) -> Path:
    return folder / f"{seed}-{arm.replace('+', '-')}.tar.gz"


def node_files(path: Path, name: str) -> list[list[dict]]:
    """Each node's rows of `name` (evals.jsonl or cpu.jsonl) in one arm's archive."""
    with tarfile.open(path) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(f"/{name}")), key=lambda m: m.name)
        return [[json.loads(line) for line in io.TextIOWrapper(tar.extractfile(m), encoding="utf-8") if line.strip()]
                for m in members]


def primary(path: Path) -> float:
    """The run's primary metric: over its nodes, the mean over the counted evaluations of the mean
    over the datasets."""
    nodes = node_files(path, "evals.jsonl")
    return statistics.fmean(
        statistics.fmean(statistics.fmean(r["per_dataset"].values()) for r in rows if r["round"] in COUNTED_EVALS)
        for rows in nodes)


def cpu_per_node_round(path: Path) -> float:
    seconds = []
    for rows in node_files(path, "cpu.jsonl"):
        last = {r["round"]: r["cpu_s"] for r in rows}  # a resumed round keeps its last record
        seconds += [s for k, s in last.items() if 2 <= k <= 60]
    return statistics.fmean(seconds)


def pairs_for(sd_points: float) -> int:
    """The fewest pairs (at least FEWEST, at most MOST) that detect TARGET_POINTS at 80 % power."""
    for n in range(FEWEST, MOST + 1):
        if detectable_effect(n) * sd_points <= TARGET_POINTS:
            return n
    return MOST


def main(folder: Path) -> None:
    missing = [archive(folder, s, a).name for s in SEEDS for a in ARMS if not archive(folder, s, a).exists()]
    if missing:
        sys.exit(f"not yet: {len(missing)} archives missing ({', '.join(missing)})")
    a, b = PRIMARY
    differences = [primary(archive(folder, s, a)) - primary(archive(folder, s, b)) for s in SEEDS]
    sd = 100 * statistics.stdev(differences)
    print(f"{a} - {b}: SD of the {len(differences)} seeds' paired differences {sd:.1f} points; "
          f"pairs for 80 % power at {TARGET_POINTS:g} points: {pairs_for(sd)}")
    for arm in ARMS:
        costs = [cpu_per_node_round(archive(folder, s, arm)) for s in SEEDS]
        alone = [cpu_per_node_round(archive(folder, s, "alone")) for s in SEEDS]
        print(f"{arm}: {statistics.fmean(costs):.1f} CPU s a node-round, "
              f"{statistics.fmean(costs) / statistics.fmean(alone):.2f}x alone")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)

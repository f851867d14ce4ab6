"""The rescue pilot's paired standard deviations (docs/rescue-experiment.md): only SDs, never a mean
score; and each arm's CPU seconds per node-round (rounds 2-30: round 1 compiles).

    python assets/results/rescue-pilot/pilot_sd.py [RUNS_DIR]

RUNS_DIR: the pilot's `--out` folder's runs/ (default: the copy of its evals.jsonl files beside
this script; the pilot's scores are kept there as data, not reported).
"""

import json
import statistics
import sys
from pathlib import Path

ARMS = ("alone", "fill", "fill+rescue")
PAIRS = (("fill+rescue", "fill"), ("fill+rescue", "alone"), ("fill", "alone"))


def primary(node: Path) -> float:
    """Mean over the evaluations at rounds 10, 20 and 30 of the mean over the datasets."""
    rows = [json.loads(line) for line in (node / "evals.jsonl").read_text().splitlines() if line.strip()]
    return statistics.fmean(statistics.fmean(r["per_dataset"].values()) for r in rows if r["round"] in (10, 20, 30))


def main(runs: Path) -> None:
    scores = {arm: [primary(runs / arm / "seed-799" / f"node-{k}") for k in range(4)] for arm in ARMS}
    for a, b in PAIRS:
        differences = [x - y for x, y in zip(scores[a], scores[b])]
        print(f"{a} - {b}: SD of the 4 nodes' paired differences {100 * statistics.stdev(differences):.1f} points")
    alone = None
    for arm in ARMS:
        seconds = [json.loads(line)["cpu_s"] for k in range(4)
                   for line in (runs / arm / "seed-799" / f"node-{k}" / "cpu.jsonl").read_text().splitlines()
                   if line.strip() and json.loads(line)["round"] > 1]
        mean = statistics.fmean(seconds)
        alone = alone or mean
        print(f"{arm}: {mean:.1f} CPU s per node-round, {mean / alone:.2f}x alone")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("runs"))

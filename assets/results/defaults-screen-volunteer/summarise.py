"""The defaults screen's table from the files beside this script: python summarise.py

Each setting-N/ is one `swarmling experiment --design volunteer --seeds 1 --rounds 30` with the
--set overrides its plan.json names; evals.jsonl holds its held-out accuracy per dataset (40
items each, never trained on) after rounds 0, 10, 20 and 30. Runs cut by the call's clock stop
early; batch-1's settings 1 and 5 failed at start (the conversion race fixed in 7df4e19) and
are not here.
"""

import json
import math
from pathlib import Path
from statistics import fmean

HERE = Path(__file__).parent


def setting(plan: dict) -> str:
    o = dict(plan["overrides"])
    return (f"lr {o['train.learning_rate']:g}, beta {o['train.kl_beta']:g}, "
            f"min batch {o.get('train.min_signal_groups', 4)}")


rows = {}
for evals in sorted(HERE.glob("batch-*/setting-*/runs/*/seed-*/node-0/evals.jsonl")):
    run = evals.parents[4]
    seed = int(evals.parents[1].name.removeprefix("seed-"))
    scores = {}
    for line in evals.read_text().splitlines():
        r = json.loads(line)
        scores[r["round"]] = fmean(r["per_dataset"].values())
    rows.setdefault(setting(json.loads((run / "plan.json").read_text())), {})[seed] = scores

print("| setting | seed | round 10 | round 20 | round 30 |")
print("|---|---|---|---|---|")
for name, seeds in sorted(rows.items()):
    for seed, scores in sorted(seeds.items()):
        if len(scores) < 2:  # cut by the clock before its first evaluation after training
            continue
        cells = [f"{100 * scores[r]:.1f} %" if r in scores else "–" for r in (10, 20, 30)]
        print(f"| {name} | {seed} | {' | '.join(cells)} |")
items = 6 * 40
base = json.loads(next(HERE.glob("batch-*/setting-*/base.json")).read_text())["smollm2-135m"]
print(f"\nOne evaluation's standard error at 10 %: {100 * math.sqrt(0.1 * 0.9 / items):.1f} points "
      f"({items} items); the base model (round 0) scores {100 * fmean(base.values()):.1f} %.")

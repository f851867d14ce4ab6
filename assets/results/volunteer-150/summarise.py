"""The reported runs' table and plot from the files beside this script: python summarise.py
(or from another results folder of the same layout: python summarise.py ../volunteer-500)

seed-*/ holds each run's evals.jsonl (held-out accuracy per dataset after every 10th round, 40
items each, reserved: never trained on), metrics.jsonl (the node's record of every round) and
plan.json. Prints, per seed, the held-out curve with its standard error, the best so far, the
largest drop below it after round 30 in standard errors, and what one fixed answer per dataset
scores on the same items; writes <folder>.png (held-out, entropy, KL, learnable groups and
gradient norm over the rounds). metrics.jsonl may be gzipped (metrics.jsonl.gz).
"""

import gzip
import json
import math
import re
import sys
from pathlib import Path
from statistics import fmean

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).parent
ITEMS = 40  # per dataset


def read(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else gzip.decompress(Path(f"{path}.gz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-9) / n)


runs = {}
for folder in sorted(HERE.glob("seed-*")):
    evals = read(folder / "evals.jsonl")
    metrics = read(folder / "metrics.jsonl")
    runs[folder.name] = (evals, metrics)

for name, (evals, _) in runs.items():
    print(f"\n{name}: round, held-out (mean over {len(evals[0]['per_dataset'])} datasets) ± SE, best so far")
    best, worst_drop = 0.0, 0.0
    for e in evals:
        acc = fmean(e["per_dataset"].values())
        n = ITEMS * len(e["per_dataset"])
        err = se(acc, n)
        if e["round"] > 30 and best > acc:
            worst_drop = max(worst_drop, (best - acc) / err)
        best = max(best, acc)
        per = ", ".join(f"{d} {100 * v:.0f}" for d, v in e["per_dataset"].items())
        print(f"  {e['round']:>4}  {100 * acc:5.1f} % ± {100 * err:.1f}  (best {100 * best:.1f} %)  [{per}]")
    print(f"  largest drop below the best so far after round 30: {worst_drop:.1f} SE")
    table = HERE / name / "table.md"  # the report's line: 'One fixed answer to every item scores chain_sum 10.0% ("7"), ...'
    fixed = [float(x) for x in re.findall(r"([\d.]+)% \(\"", table.read_text())] if table.exists() else []
    if fixed:
        print(f"  the best fixed answer per dataset (table.md), mean over {len(fixed)} datasets: {fmean(fixed):.2f} %")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    raise SystemExit(0)
panels = [("held-out accuracy", None), ("token entropy (nats)", "token_entropy"), ("KL to base (k3, nats/token)", "kl"),
          ("groups with right and wrong replies", "signal_groups"), ("gradient norm", "grad_norm")]
fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True)
for name, (evals, metrics) in runs.items():
    for ax, (label, key) in zip(axes, panels):
        if key is None:
            xs = [e["round"] for e in evals]
            ys = [fmean(e["per_dataset"].values()) for e in evals]
            errs = [se(y, ITEMS * len(evals[0]["per_dataset"])) for y in ys]
            ax.errorbar(xs, ys, yerr=errs, label=name, capsize=2)
        else:
            source = [(m["round"], (m.get("train") or {}).get(key) if key in ("kl", "grad_norm") else m.get(key))
                      for m in metrics]
            source = [(r, v) for r, v in source if v is not None]
            ax.plot([r for r, _ in source], [v for _, v in source], lw=0.8, label=name)
        ax.set_ylabel(label, fontsize=8)
axes[0].legend(fontsize=8)
axes[-1].set_xlabel("round")
fig.tight_layout()
fig.savefig(HERE / f"{HERE.name}.png", dpi=110)
print(f"\nplot: {HERE / f'{HERE.name}.png'}")

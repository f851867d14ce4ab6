"""What came out of an experiment: the primary metric per node, arm and seed (the mean of its
evaluations after the burn-in) and the second endpoint (the last round's accuracy), each paired by
seed against the baseline arm, in `summary.json`,
`table.md` and `experiment.png/.svg` (the curves, and the paired differences with their interval)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from statistics import fmean, stdev

import numpy as np

from ...learning.round_record import RoundRecord
from ...metrics import read_records
from ...learning.evaluation import at_level_tasks, fixed_answer_score
from .grid import CPU_FILE, EVALS_FILE, INVOCATIONS_FILE, RESUMES_FILE, EvalLog, ExperimentOptions, node_config
from .statistics import paired_difference


# A speciality where one answer given to every item scores this much has a shortcut a policy gradient
# finds (letter_counting at level 0: "1", 65 %; the designs' other specialities: 10 %). The report
# also compares the arms without such specialities: a sensitivity analysis, added after the
# specialists grid had run, not the primary metric.
SHORTCUT = 0.25


def summarise(options: ExperimentOptions) -> dict:
    design = options.design
    fixed_answers = _fixed_answers(options)
    shortcuts = [d for d, f in fixed_answers.items() if f["accuracy"] >= SHORTCUT]
    arms = {}
    for arm in design.arms:
        seeds = {}
        for seed in options.seed_values:
            run_dir = options.run_dir(arm, seed)
            nodes = [EvalLog(run_dir / f"node-{k}" / EVALS_FILE).read() for k in range(options.nodes)]
            if not all(set(design.eval_rounds(options.rounds)) <= set(n) for n in nodes):
                continue  # not finished: left out of every comparison
            curve = {r: fmean(design.primary(k, n[r]) for k, n in enumerate(nodes)) for r in sorted(nodes[0])}
            by_node = [fmean(design.primary(k, n[r]) for r in n if design.counted(r)) for k, n in enumerate(nodes)]
            records = [[RoundRecord.from_dict(r) for r in read_records(run_dir / f"node-{k}" / "state" / "metrics.jsonl")]
                       for k in range(options.nodes)]
            seeds[str(seed)] = {
                "primary": fmean(v for r, v in curve.items() if design.counted(r)),
                "final": curve[options.rounds],  # the second endpoint: where the arm ended up
                "primary_without_shortcuts": fmean(
                    _mean_present(design.primary(k, n[r], shortcuts) for k, n in enumerate(nodes))
                    for r in sorted(nodes[0]) if design.counted(r)) if shortcuts else None,
                "curve": [[r, v] for r, v in curve.items()],
                # heterogeneous swarms (--models): each model's nodes apart, as their means differ
                "primary_by_model": {m: fmean(v for k, v in enumerate(by_node) if options.model_of(k) == m)
                                     for m in dict.fromkeys(options.model_of(k) for k in range(options.nodes)) if m},
                "per_dataset_final": {d: fmean(n[options.rounds][d] for n in nodes) for d, _ in design.specialities},
                "node_round_seconds": _mean([r.wall_seconds for recs in records for r in recs[1:]]),
                # round 1 left out of both (warm-up)
                "node_round_cpu_seconds": _cpu_seconds(options, run_dir),
                "external_advantage_share": _mean([r.external_advantage_share for recs in records for r in recs]),
                "backends": sorted({r.backend for recs in records for r in recs if r.backend}),
                "rss_bytes": _memory(run_dir),
                # resumed mid-way without what its peers had sent (a kill, not a stop): sharing arms only
                "resumed_at": [r["round"] for r in read_records(run_dir / RESUMES_FILE)
                               if arm.external and not r.get("inboxes")],
            }
        if not seeds and arm.name != design.baseline:
            continue  # nothing finished (not run: --arms), nothing to show
        values = [s["primary"] for s in seeds.values()]
        models = dict.fromkeys(m for s in seeds.values() for m in s["primary_by_model"])
        arms[arm.name] = {"seeds": seeds, "primary_mean": fmean(values) if values else None,
                          "primary_by_model": {m: fmean(s["primary_by_model"][m] for s in seeds.values()) for m in models},
                          # what the mix became: a 2/6 arm trains on fewer peers' groups when peers have few with signal
                          "external_advantage_share": _mean([s["external_advantage_share"] for s in seeds.values()]),
                          "primary_se": stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None,
                          "node_round_seconds": _mean([s["node_round_seconds"] for s in seeds.values()]),
                          "node_round_cpu_seconds": _all_or_none([s["node_round_cpu_seconds"] for s in seeds.values()])}
    baseline = arms[design.baseline]["seeds"]
    comparisons = {}
    for name, arm in arms.items():
        compared = _paired(arm["seeds"], baseline) if name != design.baseline else None
        if compared:
            comparisons[name] = compared
            compared["final"] = _paired(arm["seeds"], baseline, lambda run: run["final"])
            if shortcuts:
                compared["without_shortcuts"] = _paired(arm["seeds"], baseline, lambda run: run["primary_without_shortcuts"])
            by_model = {m: _paired(arm["seeds"], baseline, lambda run, m=m: run["primary_by_model"][m])
                        for m in arm["primary_by_model"]}
            if len(by_model) > 1:  # a heterogeneous swarm: did each model gain?
                compared["by_model"] = by_model
    contrasts = {}
    for name, against in design.contrasts:
        runs, others = arms.get(name, {}).get("seeds", {}), arms.get(against, {}).get("seeds", {})
        compared = _paired(runs, others)
        if compared:
            contrasts[f"{name} - {against}"] = compared | {"arm": name, "against": against}
            if shortcuts:
                contrasts[f"{name} - {against}"]["without_shortcuts"] = _paired(
                    runs, others, lambda run: run["primary_without_shortcuts"])
    invocations = options.out / INVOCATIONS_FILE
    revisions = sorted({json.loads(line).get("revision") or "unknown" for line in invocations.read_text().splitlines()
                        if line.strip()}) if invocations.exists() else []
    backends = sorted({b for arm in arms.values() for run in arm["seeds"].values() for b in run["backends"]})
    return {"revisions": revisions, "backends": backends, "design": design.name, "metric": design.metric, "baseline": design.baseline, "nodes": options.nodes,
            "rounds": options.rounds, "seeds": list(options.seed_values), "burn_in": design.burn_in,
            "eval_rounds": design.eval_rounds(options.rounds), "models": list(options.models),
            "specialities": [list(s) for s in design.specialities], "arms": arms, "comparisons": comparisons,
            "contrasts": contrasts, "eval_items": design.eval_items, "fixed_answers": fixed_answers, "shortcuts": shortcuts}


def _fixed_answers(options: ExperimentOptions) -> dict[str, dict]:
    """Per speciality, what one answer given to every held-out item scores: an arm at that figure
    has likely learned the answer, not the skill."""
    design = options.design
    preset = node_config(options, design.arms[0], options.seed_values[0], 0).round.preset
    scores = {d: fixed_answer_score(at_level_tasks(preset, d, level, design.eval_items)) for d, level in design.specialities}
    return {d: {"answer": f.answer, "accuracy": f.accuracy} for d, f in scores.items()}


def _paired(runs: dict, others: dict, metric=lambda run: run["primary"]) -> dict | None:
    """The paired difference of `metric` between two arms' runs over the seeds both finished."""
    seeds = [s for s in runs if s in others]
    if not seeds:
        return None
    return asdict(paired_difference([metric(runs[s]) for s in seeds], [metric(others[s]) for s in seeds])) | {"seeds": seeds}


def _mean_present(values) -> float:
    """The mean of the values that are numbers (a node with no speciality left is out)."""
    present = [v for v in values if not math.isnan(v)]
    return fmean(present) if present else math.nan


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def _cpu_seconds(options: ExperimentOptions, run_dir: Path) -> float | None:
    """Mean CPU seconds of a node-round after the first; None unless every node logged every one
    (a grid begun before cpu.jsonl was written has only its later rounds: those train more often)."""
    rows = [read_records(run_dir / f"node-{k}" / CPU_FILE) for k in range(options.nodes)]
    wanted = set(range(2, options.rounds + 1))
    if not wanted or any(not wanted <= {r["round"] for r in node} for node in rows):
        return None
    return fmean(r["cpu_s"] for node in rows for r in node if r["round"] in wanted)


def _all_or_none(values) -> float | None:
    """The mean where every run has the figure (a mean over some runs would compare unlike sets)."""
    return fmean(values) if values and None not in values else None


def _memory(run_dir: Path) -> int | None:
    path = run_dir / "memory.json"
    return json.loads(path.read_text())["rss_bytes"] if path.exists() else None


def table(summary: dict) -> str:
    counted = [r for r in summary["eval_rounds"] if r > summary["burn_in"]]
    lines = [
        f"**{summary['design']}**: {summary['nodes']} nodes x {summary['rounds']} rounds, seeds "
        f"{summary['seeds'][0]}-{summary['seeds'][-1]}, primary metric: {summary['metric']} (mean of the "
        f"evaluations after rounds {', '.join(map(str, counted))}; specialities "
        f"{', '.join(f'{d} level {lv}' for d, lv in summary['specialities'])})"
        + (f"; models {', '.join(summary['models'])}" if summary["models"] else ""),
        "",
        f"| arm | seeds | {summary['metric']} (mean ± SE) | vs {summary['baseline']}: paired difference [95% CI] "
        "| smallest detectable (80% power) | seconds per node-round (vs baseline) | peers' share of the advantage |",
        "|---|---|---|---|---|---|---|",
    ]
    baseline = summary["arms"][summary["baseline"]]
    for name, arm in summary["arms"].items():
        mean, se = arm["primary_mean"], arm["primary_se"]
        c = summary["comparisons"].get(name)
        diff = _difference(c) if c and c["pairs"] > 1 else "-"
        detect = f"{c['detectable']:.1%}" if c and c["pairs"] > 1 else "-"
        cost, share = _cost(arm, baseline), arm["external_advantage_share"]
        lines.append(f"| {name} | {len(arm['seeds'])} | {'-' if mean is None else f'{mean:.1%}'}"
                     f"{f' ± {se:.1%}' if se else ''} | {diff} | {detect} | {cost} | "
                     f"{'-' if share is None else f'{share:.0%}'} |")
    for label, c in summary.get("contrasts", {}).items():
        lines += ["", f"{label}, paired by seed ({c['pairs']} pairs): {_difference(c)}"
                      + (f", smallest detectable {c['detectable']:.1%}." if c["pairs"] > 1 else ".")]
    finals = {name: c["final"] for name, c in summary["comparisons"].items() if c.get("final")}
    if finals:
        lines += ["", f"At the last round ({summary['rounds']}), paired by seed against {summary['baseline']}: "
                      + "; ".join(f"{name} {_difference(c)}" for name, c in finals.items()) + "."]
    lines += _per_speciality(summary)
    if summary.get("shortcuts"):
        without = {name: c["without_shortcuts"] for name, c in summary["comparisons"].items()} | {
            label: c["without_shortcuts"] for label, c in summary.get("contrasts", {}).items()}
        lines += ["", f"Leaving out {', '.join(summary['shortcuts'])} (one answer scores at least {SHORTCUT:.0%} of its "
                      "items; a sensitivity analysis), paired by seed: "
                      + "; ".join(f"{label} {_difference(c)}" for label, c in without.items()) + "."]
    if any(len(arm["primary_by_model"]) > 1 for arm in summary["arms"].values()):
        lines += ["", "By model (each model's nodes, mean over seeds): " + "; ".join(
            f"{name}: " + ", ".join(f"{m} {mean:.1%}" + _by_model_difference(summary, name, m)
                                   for m, mean in arm["primary_by_model"].items())
            for name, arm in summary["arms"].items() if arm["seeds"]) + "."]
    resumed = [f"{name} seed {seed} at round {', '.join(map(str, run['resumed_at']))}"
               for name, arm in summary["arms"].items() for seed, run in arm["seeds"].items() if run.get("resumed_at")]
    if len(summary.get("revisions", [])) > 1:
        lines += ["", f"Ran on more than one code revision: {', '.join(summary['revisions'])} (invocations.jsonl)."]
    if len(summary.get("backends", [])) > 1:  # --archive or --arms can bring runs from another machine
        base_runs = summary["arms"][summary["baseline"]]["seeds"]
        crossed = [f"{name} seed {seed}" for name, arm in summary["arms"].items() for seed, run in arm["seeds"].items()
                   if seed in base_runs and run["backends"] != base_runs[seed]["backends"]]
        lines += ["", f"Ran on more than one backend ({', '.join(summary['backends'])}): the means pool them"
                      + (f", and these pairs cross them, unlike with like: {', '.join(crossed)}." if crossed else ".")]
    if resumed:
        lines += ["", f"Resumed after a kill (weights exact; groups peers had sent and the node had not used lost): "
                      f"{'; '.join(resumed)}."]
    return "\n".join(lines) + "\n"


def _difference(c: dict) -> str:
    """A paired difference, with its 95 % interval where there are two pairs or more."""
    return f"{c['mean']:+.1%}" + (f" [{c['low']:+.1%}, {c['high']:+.1%}]" if c["pairs"] > 1 else "")


def _per_speciality(summary: dict) -> list[str]:
    """Each arm's accuracy per speciality at the last round beside what one fixed answer scores,
    and the specialities where an arm sits at that figure (half an item either way)."""
    fixed = summary.get("fixed_answers")
    if not fixed:
        return []
    finals = {name: {d: fmean(run["per_dataset_final"][d] for run in arm["seeds"].values()) for d in fixed}
              for name, arm in summary["arms"].items() if arm["seeds"]}
    lines = ["", f"Per speciality at the last round (mean of nodes and seeds): " + "; ".join(
        f"{name}: " + ", ".join(f"{d} {v:.1%}" for d, v in by_d.items()) for name, by_d in finals.items())
        + ". One fixed answer to every item scores " + ", ".join(
        f"{d} {f['accuracy']:.1%} (\"{f['answer']}\")" for d, f in fixed.items()) + "."]
    half_item = 0.5 / summary["eval_items"]
    for d, f in fixed.items():
        at = [name for name, by_d in finals.items() if f["accuracy"] > 0 and abs(by_d[d] - f["accuracy"]) < half_item]
        if at:
            lines.append(f"{d}: {', '.join(at)} score exactly what the answer \"{f['answer']}\" to every item scores: "
                         "likely that answer learned, not the skill.")
    return lines


def _by_model_difference(summary: dict, arm: str, model: str) -> str:
    c = summary["comparisons"].get(arm, {}).get("by_model", {}).get(model)
    if not c:
        return ""
    return f" (vs {summary['baseline']}: {_difference(c)}{'' if c['pairs'] > 1 else ', 1 pair'})"


def _cost(arm: dict, baseline: dict) -> str:
    """CPU seconds per node-round against the baseline's; wall seconds, marked, for grids run
    before CPU time was logged (a pause or a busy machine counts in those)."""
    for key, unit in (("node_round_cpu_seconds", " CPU s"), ("node_round_seconds", " wall s (any pauses included)")):
        if arm.get(key) and baseline.get(key):
            return f"{arm[key]:.1f}{unit} ({arm[key] / baseline[key]:.2f}x)"
    return "-"


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, diffs) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for name, arm in summary["arms"].items():
        runs = [dict(map(tuple, s["curve"])) for s in arm["seeds"].values()]
        if runs:
            rounds = sorted(set.intersection(*(set(r) for r in runs)))
            curves.plot(rounds, [fmean(r[x] for r in runs) for x in rounds], marker="o", label=name)
    curves.axvspan(0, summary["burn_in"], color="0.9", label="burn-in")
    curves.set(title=f"{summary['design']}: {summary['metric']}", xlabel="round (weights after it)", ylabel="accuracy")
    pairs = [(f"{name} - {summary['baseline']}", name, summary["baseline"], c) for name, c in summary["comparisons"].items()]
    pairs += [(label, c["arm"], c["against"], c) for label, c in summary.get("contrasts", {}).items()]
    for i, (_, name, against, c) in enumerate(pairs):
        points = [summary["arms"][name]["seeds"][s]["primary"] - summary["arms"][against]["seeds"][s]["primary"]
                  for s in c["seeds"]]
        diffs.scatter(np.full(len(points), i) + np.linspace(-0.1, 0.1, len(points)), points, color="0.5", zorder=2)
        if c["pairs"] > 1:
            diffs.errorbar(i, c["mean"], yerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="o", color="C3",
                           capsize=6, zorder=3)
    diffs.axhline(0, color="black", lw=0.8)
    diffs.set_xticks(range(len(pairs)), [label.replace(" - ", "\n- ") for label, *_ in pairs])
    diffs.set(title="paired differences per seed, mean and 95% CI", ylabel="difference in accuracy")
    for ax in (curves, diffs):
        ax.grid(alpha=0.3)
    curves.legend(fontsize=8)
    for suffix in ("png", "svg"):
        fig.savefig(out / f"experiment.{suffix}")
    plt.close(fig)

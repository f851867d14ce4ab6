"""What came out of an experiment: the primary metric per node, arm and seed (the mean of its
evaluations after the burn-in) and the second endpoint (the last round's accuracy), each paired by
seed against the baseline arm, in `summary.json`,
`table.md` and `experiment.png/.svg` (the curves, and the paired differences with their interval)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import msgspec
from pathlib import Path
from statistics import fmean, stdev

import numpy as np

from ...learning.round_record import RoundRecord
from ...metrics import read_records
from ...learning.evaluation import at_level_tasks, fixed_answer_score
from .grid import CPU_FILE, EVALS_FILE, INVOCATIONS_FILE, RESUMES_FILE, EvalLog, ExperimentOptions, node_config
from .statistics import paired_difference
from .summary import ArmSummary, Comparison, FixedAnswer, Paired, RunSummary, Summary


# A speciality where one answer given to every item scores this much has a shortcut a policy gradient
# finds (letter_counting at level 0: "1", 65 %; the designs' other specialities: 10 %). The report
# also compares the arms without such specialities: a sensitivity analysis, added after the
# specialists grid had run, not the primary metric.
SHORTCUT = 0.25


def summarise(options: ExperimentOptions) -> Summary:
    design = options.design
    fixed_answers = _fixed_answers(options)
    shortcuts = [d for d, f in fixed_answers.items() if f.accuracy >= SHORTCUT]
    arms = {}
    for arm in design.arms:
        seeds = {}
        for seed in options.seed_values:
            run_dir = options.run_dir(arm, seed)
            nodes = [EvalLog(run_dir / f"node-{k}" / EVALS_FILE).read() for k in range(options.nodes)]
            if not all(set(design.eval_rounds(options.rounds)) <= set(n) for n in nodes):
                continue  # not finished: left out of every comparison
            curve = {r: fmean(design.primary(k, n[r]) for k, n in enumerate(nodes)) for r in sorted(nodes[0])}
            counted = [r for r in sorted(nodes[0]) if design.counted(r)]
            by_node = [fmean(design.primary(k, n[r]) for r in counted) for k, n in enumerate(nodes)]
            # a node with nothing left outside the shortcuts is out of the sensitivity analysis
            without = [_number_or_none(fmean(design.primary(k, n[r], shortcuts) for r in counted))
                       for k, n in enumerate(nodes)] if shortcuts else []
            records = [[RoundRecord.from_dict(r) for r in read_records(run_dir / f"node-{k}" / "state" / "metrics.jsonl")]
                       for k in range(options.nodes)]
            seeds[str(seed)] = RunSummary(
                primary=fmean(curve[r] for r in counted),
                final=curve[options.rounds],  # the second endpoint: where the arm ended up
                primary_without_shortcuts=_mean(without),
                curve=list(curve.items()),
                # heterogeneous swarms (--models): each model's nodes apart, as their means differ
                primary_by_model=_by_model(options, by_node),
                without_shortcuts_by_model=_by_model(options, without) if without else {},
                final_by_node=[n[options.rounds] for n in nodes],  # per speciality: who sits at a shortcut
                per_dataset_final={d: fmean(n[options.rounds][d] for n in nodes) for d, _ in design.specialities},
                # round 1 left out of both (warm-up)
                node_round_seconds=_mean([r.wall_seconds for recs in records for r in recs[1:]]),
                node_round_cpu_seconds=_cpu_seconds(options, run_dir),
                external_advantage_share=_mean([r.external_advantage_share for recs in records for r in recs]),
                rescued_per_node_round=_mean([r.rescued_groups for recs in records for r in recs]),
                backends=sorted({r.backend for recs in records for r in recs if r.backend}),
                rss_bytes=_memory(run_dir),
                # resumed mid-way without what its peers had sent (a kill, not a stop): sharing arms only
                resumed_at=[r["round"] for r in read_records(run_dir / RESUMES_FILE)
                            if arm.external and not r.get("inboxes")],
            )
        if not seeds and arm.name != design.baseline:
            continue  # nothing finished (not run: --arms), nothing to show
        values = [s.primary for s in seeds.values()]
        arms[arm.name] = ArmSummary(
            seeds=seeds, primary_mean=fmean(values) if values else None,
            primary_by_model=_mean_by_model(seeds.values(), "primary_by_model"),
            # what the mix became: a 2/6 arm trains on fewer peers' groups when peers have few with signal
            external_advantage_share=_mean([s.external_advantage_share for s in seeds.values()]),
            rescued_per_node_round=_mean([s.rescued_per_node_round for s in seeds.values()]),
            primary_se=stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None,
            node_round_seconds=_mean([s.node_round_seconds for s in seeds.values()]),
            node_round_cpu_seconds=_all_or_none([s.node_round_cpu_seconds for s in seeds.values()]))
    baseline = arms[design.baseline].seeds
    comparisons = {name: c for name, arm in arms.items() if name != design.baseline
                   if (c := _compare(arm.seeds, baseline))}
    contrasts = {f"{name} - {against}": msgspec.structs.replace(c, arm=name, against=against) for name, against in design.contrasts
                 if name in arms and against in arms and (c := _compare(arms[name].seeds, arms[against].seeds))}
    invocations = options.out / INVOCATIONS_FILE
    revisions = sorted({json.loads(line).get("revision") or "unknown" for line in invocations.read_text().splitlines()
                        if line.strip()}) if invocations.exists() else []
    backends = sorted({b for arm in arms.values() for run in arm.seeds.values() for b in run.backends})
    return Summary(revisions=revisions, backends=backends, design=design.name, metric=design.metric,
                   baseline=design.baseline, nodes=options.nodes, rounds=options.rounds,
                   seeds=list(options.seed_values), burn_in=design.burn_in, eval_rounds=design.eval_rounds(options.rounds),
                   models=list(options.models), specialities=[tuple(s) for s in design.specialities], arms=arms,
                   comparisons=comparisons, contrasts=contrasts, eval_items=design.eval_items,
                   fixed_answers=fixed_answers, shortcuts=shortcuts)


def _fixed_answers(options: ExperimentOptions) -> dict[str, FixedAnswer]:
    """Per speciality, what one answer given to every held-out item scores: an arm at that figure
    has likely learned the answer, not the skill."""
    design = options.design
    preset = node_config(options, design.arms[0], options.seed_values[0], 0).round.preset
    scores = {d: fixed_answer_score(at_level_tasks(preset, d, level, design.eval_items)) for d, level in design.specialities}
    return {d: FixedAnswer(f.answer, f.accuracy) for d, f in scores.items()}


def _compare(runs: dict[str, RunSummary], others: dict[str, RunSummary]) -> Comparison | None:
    """Two arms' runs paired by seed: the primary metric, the last round, the sensitivity analysis
    without shortcuts where there are any, and each model's nodes apart in a heterogeneous swarm."""
    primary = _paired(runs, others)
    if primary is None:
        return None
    by_model: dict[str, dict[str, Paired] | None] = {}
    for key, by_model_key in (("by_model", "primary_by_model"), ("without_shortcuts_by_model", "without_shortcuts_by_model")):
        models = dict.fromkeys(m for run in runs.values() for m in getattr(run, by_model_key))
        compared = {m: c for m in models
                    if (c := _paired(runs, others, lambda run, m=m, k=by_model_key: getattr(run, k).get(m)))}
        by_model[key] = compared if len(compared) > 1 else None  # a heterogeneous swarm: did each model gain?
    return Comparison(**msgspec.structs.asdict(primary), final=_paired(runs, others, lambda run: run.final),
                      without_shortcuts=_paired(runs, others, lambda run: run.primary_without_shortcuts), **by_model)


def _paired(runs: dict[str, RunSummary], others: dict[str, RunSummary], metric=lambda run: run.primary) -> Paired | None:
    """The paired difference of `metric` between two arms' runs over the seeds both finished and
    both have the metric for."""
    seeds = [s for s in runs if s in others and metric(runs[s]) is not None and metric(others[s]) is not None]
    if not seeds:
        return None
    difference = asdict(paired_difference([metric(runs[s]) for s in seeds], [metric(others[s]) for s in seeds]))
    # one pair has no spread: null in summary.json (NaN is not JSON)
    return Paired(**{k: _number_or_none(v) if isinstance(v, float) else v for k, v in difference.items()}, seeds=seeds)


def _by_model(options: ExperimentOptions, by_node: list) -> dict[str, float | None]:
    """Each model's nodes' mean (--models: round-robin over the nodes; nothing without it)."""
    return {m: _mean(v for k, v in enumerate(by_node) if options.model_of(k) == m)
            for m in dict.fromkeys(options.model_of(k) for k in range(options.nodes)) if m}


def _number_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


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


def table(summary: Summary) -> str:
    counted = [r for r in summary.eval_rounds if r > summary.burn_in]
    lines = [
        f"**{summary.design}**: {summary.nodes} nodes x {summary.rounds} rounds, seeds "
        f"{summary.seeds[0]}-{summary.seeds[-1]}, primary metric: {summary.metric} (mean of the "
        f"evaluations after rounds {', '.join(map(str, counted))}; specialities "
        f"{', '.join(f'{d} level {lv}' for d, lv in summary.specialities)})"
        + (f"; models {', '.join(summary.models)}" if summary.models else ""),
        "",
        f"| arm | seeds | {summary.metric} (mean ± SE) | vs {summary.baseline}: paired difference [95% CI] "
        "| smallest detectable (80% power) | seconds per node-round (vs baseline) | peers' share of the advantage |",
        "|---|---|---|---|---|---|---|",
    ]
    baseline = summary.arms[summary.baseline]
    for name, arm in summary.arms.items():
        mean, se = arm.primary_mean, arm.primary_se
        c = summary.comparisons.get(name)
        diff = _difference(c) if c and c.pairs > 1 else "-"
        detect = f"{c.detectable:.1%}" if c and c.pairs > 1 else "-"
        cost, share = _cost(arm, baseline), arm.external_advantage_share
        lines.append(f"| {name} | {len(arm.seeds)} | {'-' if mean is None else f'{mean:.1%}'}"
                     f"{f' ± {se:.1%}' if se else ''} | {diff} | {detect} | {cost} | "
                     f"{'-' if share is None else f'{share:.0%}'} |")
    rescued = {name: arm.rescued_per_node_round for name, arm in summary.arms.items()}
    if any(rescued.values()):
        lines += ["", "Groups rescued (own all-wrong groups given a signal by peers' right replies) per node-round: "
                  + ", ".join(f"{name} {'-' if v is None else f'{v:.2f}'}" for name, v in rescued.items()) + "."]
    for label, c in summary.contrasts.items():
        lines += ["", f"{label}, paired by seed ({c.pairs} pairs): {_difference(c)}"
                      + (f", smallest detectable {c.detectable:.1%}." if c.pairs > 1 else ".")]
    compared = {f"{name} - {summary.baseline}": c for name, c in summary.comparisons.items()} | summary.contrasts
    lines += _endpoint_line(compared, "final", f"At the last round ({summary.rounds}), paired by seed")
    lines += _per_speciality(summary)
    if summary.shortcuts:
        lines += _endpoint_line(compared, "without_shortcuts", f"Leaving out {', '.join(summary.shortcuts)} (one answer "
                                f"scores at least {SHORTCUT:.0%} of its items; a sensitivity analysis), paired by seed")
    for key, compared_key, label in (
            ("primary_by_model", "by_model", "By model (each model's nodes, mean over seeds)"),
            ("without_shortcuts_by_model", "without_shortcuts_by_model",
             f"By model, leaving out {', '.join(summary.shortcuts)}")):
        models = {name: _mean_by_model(arm.seeds.values(), key) for name, arm in summary.arms.items() if arm.seeds}
        if any(len(by_model) > 1 for by_model in models.values()):
            lines += ["", f"{label}: " + "; ".join(
                f"{name}: " + ", ".join(f"{m} {'-' if mean is None else f'{mean:.1%}'}"
                                        + _by_model_difference(summary, name, m, compared_key)
                                        for m, mean in by_model.items())
                for name, by_model in models.items()) + "."]
    resumed = [f"{name} seed {seed} at round {', '.join(map(str, run.resumed_at))}"
               for name, arm in summary.arms.items() for seed, run in arm.seeds.items() if run.resumed_at]
    if len(summary.revisions) > 1:
        lines += ["", f"Ran on more than one code revision: {', '.join(summary.revisions)} (invocations.jsonl)."]
    if len(summary.backends) > 1:  # --archive or --arms can bring runs from another machine
        base_runs = summary.arms[summary.baseline].seeds
        crossed = [f"{name} seed {seed}" for name, arm in summary.arms.items() for seed, run in arm.seeds.items()
                   if seed in base_runs and run.backends != base_runs[seed].backends]
        lines += ["", f"Ran on more than one backend ({', '.join(summary.backends)}): the means pool them"
                      + (f", and these pairs cross them, unlike with like: {', '.join(crossed)}." if crossed else ".")]
    if resumed:
        lines += ["", f"Resumed after a kill (weights exact; groups peers had sent and the node had not used lost): "
                      f"{'; '.join(resumed)}."]
    return "\n".join(lines) + "\n"


def _difference(c: Paired) -> str:
    """A paired difference, with its 95 % interval where there are two pairs or more."""
    return f"{c.mean:+.1%}" + (f" [{c.low:+.1%}, {c.high:+.1%}]" if c.pairs > 1 else "")


def _endpoint_line(compared: dict[str, Comparison], endpoint: str, label: str) -> list[str]:
    """One line of paired differences of a further endpoint, for every comparison that has it."""
    present = {name: getattr(c, endpoint) for name, c in compared.items() if getattr(c, endpoint)}
    if not present:
        return []
    return ["", f"{label}: " + "; ".join(f"{name} {_difference(c)}" for name, c in present.items()) + "."]


def _mean_by_model(runs, key: str) -> dict[str, float | None]:
    """Each model's mean over runs of a per-model figure (`key`: primary_by_model, without_shortcuts_by_model)."""
    runs = list(runs)
    models = dict.fromkeys(m for run in runs for m in getattr(run, key))
    return {m: _mean(getattr(run, key).get(m) for run in runs) for m in models}


def _per_speciality(summary: Summary) -> list[str]:
    """Each arm's accuracy per speciality at the last round beside what one fixed answer scores;
    for each shortcut, how many of an arm's nodes ended exactly at that answer's score."""
    fixed = summary.fixed_answers
    if not fixed:
        return []
    arms = {name: arm for name, arm in summary.arms.items() if arm.seeds}
    means = {name: {d: fmean(run.per_dataset_final[d] for run in arm.seeds.values()) for d in fixed}
             for name, arm in arms.items()}
    lines = ["", "Per speciality at the last round (mean of nodes and seeds): " + "; ".join(
        f"{name}: " + ", ".join(f"{d} {v:.1%}" for d, v in by_d.items()) for name, by_d in means.items())
        + ". One fixed answer to every item scores " + ", ".join(
        f"{d} {f.accuracy:.1%} (\"{f.answer}\")" for d, f in fixed.items()) + "."]
    half_item = 0.5 / summary.eval_items  # a node's accuracy is a whole number of items
    for d in summary.shortcuts:
        at = {name: [abs(node[d] - fixed[d].accuracy) < half_item for run in arm.seeds.values()
                     for node in run.final_by_node] for name, arm in arms.items()}
        if any(any(flags) for flags in at.values()):
            lines.append(f"{d}: nodes that ended exactly where the answer \"{fixed[d].answer}\" to every item does "
                         "(likely that answer learned, not the skill): "
                         + ", ".join(f"{name} {sum(flags)} of {len(flags)}" for name, flags in at.items()) + ".")
    return lines


def _by_model_difference(summary: Summary, arm: str, model: str, key: str = "by_model") -> str:
    compared = summary.comparisons.get(arm)
    c = (getattr(compared, key) or {}).get(model) if compared else None
    if not c:
        return ""
    return f" (vs {summary.baseline}: {_difference(c)}{'' if c.pairs > 1 else ', 1 pair'})"


def _cost(arm: ArmSummary, baseline: ArmSummary) -> str:
    """CPU seconds per node-round against the baseline's; wall seconds, marked, for grids run
    before CPU time was logged (a pause or a busy machine counts in those)."""
    for key, unit in (("node_round_cpu_seconds", " CPU s"), ("node_round_seconds", " wall s (any pauses included)")):
        mine, theirs = getattr(arm, key), getattr(baseline, key)
        if mine and theirs:
            return f"{mine:.1f}{unit} ({mine / theirs:.2f}x)"
    return "-"


def plot(summary: Summary, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, diffs) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for name, arm in summary.arms.items():
        runs = [dict(s.curve) for s in arm.seeds.values()]
        if runs:
            rounds = sorted(set.intersection(*(set(r) for r in runs)))
            curves.plot(rounds, [fmean(r[x] for r in runs) for x in rounds], marker="o", label=name)
    curves.axvspan(0, summary.burn_in, color="0.9", label="burn-in")
    curves.set(title=f"{summary.design}: {summary.metric}", xlabel="round (weights after it)", ylabel="accuracy")
    pairs = [(f"{name} - {summary.baseline}", name, summary.baseline, c) for name, c in summary.comparisons.items()]
    pairs += [(label, c.arm, c.against, c) for label, c in summary.contrasts.items()]
    for i, (_, name, against, c) in enumerate(pairs):
        points = [summary.arms[name].seeds[s].primary - summary.arms[against].seeds[s].primary for s in c.seeds]
        diffs.scatter(np.full(len(points), i) + np.linspace(-0.1, 0.1, len(points)), points, color="0.5", zorder=2)
        if c.pairs > 1:
            diffs.errorbar(i, c.mean, yerr=[[c.mean - c.low], [c.high - c.mean]], fmt="o", color="C3",
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

"""`swarmling experiment` on the fake backend: the grid runs, nodes verify and train on each
other's groups through the in-memory exchange, the outputs are written, a run stopped mid-grid
resumes to exactly what an uninterrupted one gives; and its statistics on synthetic data."""

from __future__ import annotations

import json
import math
import tarfile
from dataclasses import replace

import pytest
from fakes import FakeBackend

from swarmling.app.commands.experiment.archive import pack, unpack
from swarmling.app.commands.experiment.designs import DESIGNS, TUNED_SEEDS, Arm
from swarmling.app.commands.experiment.grid import Chunk, ExperimentOptions, node_config, run_experiment
from swarmling.app.commands.experiment.report import plot, summarise, table
from swarmling.app.commands.experiment.summary import Summary
from swarmling.app.commands.experiment.statistics import detectable_effect, paired_difference, t_quantile
from swarmling.app.errors import NodeError
from swarmling.app.learning.evaluation import at_level_tasks, fixed_answer_score
from swarmling.app.metrics import read_records
from swarmling.app.models import resolve_model
from swarmling.app.paths import resolve_paths

SMALL = replace(DESIGNS["specialists"], nodes=2, rounds=4, seeds=2, burn_in=1, eval_every=2)


def options(out, **kw) -> ExperimentOptions:
    return ExperimentOptions(**{"design": SMALL, "out": out, "nodes": 2, "rounds": 4, "seeds": 2, "seed_offset": 50,
                                "tiny": True, "threads": 1, "overrides": (("train.min_signal_groups", 0),), **kw})


def fake(spec):
    return FakeBackend()


def summary_json(o) -> dict:
    """What summary.json holds for the grid at `o` (the typed summary, written and read back)."""
    return json.loads(summarise(o).to_json())


def table_of(summary: dict) -> str:
    """The table of a summary as summary.json holds it."""
    return table(Summary.from_dict(summary))


def test_mixes_scale_to_the_rounds_questions():
    assert [Arm("x", *m).scaled(8) for m in ((8, 0), (6, 2), (4, 4), (2, 6))] == [(8, 0), (6, 2), (4, 4), (2, 6)]
    assert [Arm("x", *m).scaled(4) for m in ((8, 0), (4, 4))] == [(4, 0), (2, 2)]


def test_the_arms_of_a_pair_share_their_seed_and_differ_in_mix_and_focus():
    o = options(None)
    alone, sharing, uniform = (node_config(o, SMALL.arm(a), 51, 1) for a in ("alone", "sharing", "alone-uniform"))
    assert alone.run.seed == sharing.run.seed == uniform.run.seed == 51001
    assert (alone.round.external_groups, sharing.round.external_groups) == (0, 2)
    assert alone.round.datasets == sharing.round.datasets == ("basic_arithmetic",)  # node 1's speciality
    assert set(uniform.round.datasets) == {d for d, _ in SMALL.specialities}
    assert alone.round.levels == {"basic_arithmetic": 0} and alone.eval.every_rounds == 0


def test_an_experiment_runs_its_grid_and_writes_what_came_out(tmp_path):
    o = options(tmp_path / "exp")
    assert run_experiment(o, resolve_paths(tmp_path / "home"), build=fake, progress=lambda s: None)
    summary = summary_json(o)
    assert set(summary["arms"]) == {"alone", "sharing", "alone-uniform"}
    assert all(len(a["seeds"]) == 2 for a in summary["arms"].values())
    shares = [s["external_advantage_share"] for s in summary["arms"]["sharing"]["seeds"].values()]
    assert all(share and share > 0 for share in shares)  # the peers' verified groups were trained on
    assert all(not s["external_advantage_share"] for s in summary["arms"]["alone"]["seeds"].values())
    assert set(summary["comparisons"]) == {"sharing", "alone-uniform"}
    c = summary["contrasts"]["sharing - alone-uniform"]  # what sharing adds beyond diversity
    sharing, uniform = summary["arms"]["sharing"]["seeds"], summary["arms"]["alone-uniform"]["seeds"]
    assert c["pairs"] == 2 and math.isclose(c["mean"], sum(sharing[s]["primary"] - uniform[s]["primary"] for s in c["seeds"]) / 2)
    assert summary["comparisons"]["sharing"]["pairs"] == 2
    base = json.loads((o.out / "base.json").read_text())
    assert set(base) == {"smollm2-135m"}  # the base model scored once, shared by every node
    assert all(a["node_round_cpu_seconds"] > 0 for a in summary["arms"].values())
    assert summary["backends"] == ["fake"] and "more than one backend" not in table_of(summary)
    mixed = json.loads(json.dumps(summary)) | {"backends": ["cpu", "cuda"]}
    assert "Ran on more than one backend (cpu, cuda): the means pool them." in table_of(mixed)
    mixed["arms"]["sharing"]["seeds"]["51"]["backends"] = ["cuda"]
    assert "these pairs cross them, unlike with like: sharing seed 51." in table_of(mixed)
    text = table_of(summary)
    assert "| sharing | 2 |" in text and "paired difference" in text and "smallest detectable" in text
    assert "CPU s (" in text and "wall" not in text and "By model" not in text
    assert "sharing - alone-uniform, paired by seed (2 pairs): " in text
    plot(Summary.from_dict(summary), o.out)
    assert {"experiment.png", "experiment.svg"} <= {p.name for p in o.out.iterdir()}


def test_arms_run_apart_into_one_folder_make_one_grid_and_models_are_reported_apart(tmp_path):
    # The second model is a local GGUF file (the shipped SmolLM2 under another name): the test needs two
    # model names, not the optional Gemma package, which the test install leaves out.
    other = tmp_path / "other-model.gguf"
    other.symlink_to(resolve_model("smollm2-135m", tmp_path / "cache").gguf)
    home, models = resolve_paths(tmp_path / "home"), ("smollm2-135m", str(other))
    first = options(tmp_path / "exp", arms=("sharing",), models=models)
    assert run_experiment(first, home, build=fake, progress=lambda s: None)
    assert not (first.out / "runs" / "alone").exists()
    assert set(summary_json(first)["arms"]) == {"alone", "sharing"}  # the baseline shown, empty; the uniform arm left out
    assert not summary_json(first)["comparisons"]
    second = replace(first, arms=("alone",))
    assert run_experiment(second, home, build=fake, progress=lambda s: None)
    summary = summary_json(second)
    assert summary["comparisons"]["sharing"]["pairs"] == 2  # the sharing runs of the first invocation, paired
    seed = summary["arms"]["sharing"]["seeds"]["50"]
    assert set(seed["primary_by_model"]) == set(models)  # node 0 SmolLM2, node 1 the other model
    assert math.isclose(sum(seed["primary_by_model"].values()) / 2, seed["primary"])
    assert "By model" in table_of(summary) and str(other) in table_of(summary)
    by_other = summary["comparisons"]["sharing"]["by_model"][str(other)]
    alone = summary["arms"]["alone"]["seeds"]
    assert by_other["pairs"] == 2 and math.isclose(by_other["mean"], sum(
        summary["arms"]["sharing"]["seeds"][s]["primary_by_model"][str(other)] - alone[s]["primary_by_model"][str(other)]
        for s in ("50", "51")) / 2)


class DrawRecorder(FakeBackend):
    """What a node drew (the questions and sampling seed of each round's generation) and trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.draws, self.trained = [], []

    def generate(self, prompts, n, params, should_stop=None, on_progress=None):
        if n > 1:  # a round's groups (evaluations draw one near-greedy reply)
            self.draws.append(([p.user for p in prompts], n, params.seed))
        return super().generate(prompts, n, params, should_stop, on_progress)

    def train_step(self, samples, should_stop=None, on_progress=None):
        self.trained.append(sorted(s.completion_ids for s in samples))
        return super().train_step(samples, should_stop, on_progress)


def recorded_grid(out, **kw) -> list[DrawRecorder]:
    """The backends of a grid's nodes, in the order they were built (run by run, node by node)."""
    built = []

    def build(spec):
        built.append(DrawRecorder())
        return built[-1]

    assert run_experiment(options(out, seeds=1, **kw), resolve_paths(out / "home"), build=build, progress=lambda s: None)
    return built


def test_the_arms_of_a_pair_draw_the_same_questions_and_seeds_through_the_grid(tmp_path):
    """Common random numbers through the whole grid (real nodes, the in-memory exchange): the arms
    of a pair draw the same questions and sampling seeds in every round, and differ in what they
    train on; a pair on another seed (the negative control) draws differently."""
    alone_0, alone_1, sharing_0, sharing_1 = recorded_grid(tmp_path / "a", arms=("alone", "sharing"))
    for alone, sharing in ((alone_0, sharing_0), (alone_1, sharing_1)):
        assert len(alone.draws) == SMALL.rounds and alone.draws == sharing.draws
    assert alone_0.trained != sharing_0.trained and alone_1.trained != sharing_1.trained  # peers' groups in
    other_seed = recorded_grid(tmp_path / "b", arms=("alone",), seed_offset=51)
    assert all(d[0] != o[0] for d, o in zip(alone_0.draws, other_seed[0].draws))
    assert [d[2] for d in alone_0.draws] != [d[2] for d in other_seed[0].draws]


def write_evals(o, accuracy) -> None:
    """A synthetic grid's evaluation logs, written by hand: accuracy(arm, seed, node, round, dataset)."""
    for arm in o.arms or [a.name for a in o.design.arms]:
        for seed in o.seed_values:
            for k in range(o.nodes):
                node = o.run_dir(o.design.arm(arm), seed) / f"node-{k}"
                node.mkdir(parents=True)
                with (node / "evals.jsonl").open("w") as f:
                    for r in o.design.eval_rounds(o.rounds):
                        row = {d: accuracy(arm, seed, k, r, d) for d, _ in o.design.specialities}
                        f.write(json.dumps({"round": r, "per_dataset": row}) + "\n")


def test_the_summary_recovers_a_known_effect_from_the_grids_files(tmp_path):
    """The statistics on a synthetic grid (no run): the burn-in is cut, nodes are averaged, a
    specialist is scored outside its speciality, and the paired difference is the one built in."""
    o = options(tmp_path / "exp", arms=("alone", "sharing"))
    lift = {50: 0.10, 51: 0.06}  # sharing minus alone, per seed, outside each node's speciality
    late = {50: 0.02, 51: 0.04}  # and more at the last round (the second endpoint)

    def accuracy(arm, seed, k, r, d):
        gain = lift[seed] + late[seed] * (r == o.rounds) if arm == "sharing" and SMALL.counted(r) else 0.0
        # before the burn-in sharing is far behind: cut, it would hide the built-in lift
        early = -0.5 if arm == "sharing" and not SMALL.counted(r) and r else 0.0
        return 0.9 if d == SMALL.specialities[k][0] else 0.2 + 0.01 * k + gain + early

    write_evals(o, accuracy)
    summary = summary_json(o)
    by_seed = {s: v["primary"] for s, v in summary["arms"]["sharing"]["seeds"].items()}
    # mean of nodes, own speciality out; the evaluations after rounds 2 and 4 counted, the last one's extra halved
    assert by_seed == pytest.approx({"50": 0.205 + 0.11, "51": 0.205 + 0.08})
    c = summary["comparisons"]["sharing"]
    assert c["mean"] == pytest.approx(0.095) and c["pairs"] == 2 and c["sd"] == pytest.approx(0.03 / math.sqrt(2))
    assert c["low"] == pytest.approx(0.095 - t_quantile(0.975, 1) * 0.015)  # t with 1 df, SE = sd / sqrt(2)
    final = c["final"]  # the last round alone: lift + late, per seed
    assert final["mean"] == pytest.approx(0.11) and final["sd"] == pytest.approx(0.02 / math.sqrt(2))
    assert "At the last round (4), paired by seed: sharing - alone +11.0% [" in table_of(summary)


def test_a_speciality_one_answer_can_score_is_flagged_and_left_out_of_the_sensitivity_analysis(tmp_path):
    """letter_counting at level 0: "1" is right on 26 of its 40 held-out items (the real
    reasoning-gym items, scored by the verifier). A sharing arm that gains there only by ending at
    that 65 %, and 0.05 elsewhere: its nodes are flagged, and the comparison without it finds the 0.05."""
    o = options(tmp_path / "exp", arms=("alone", "sharing"))
    fixed = fixed_answer_score(at_level_tasks("starter", "letter_counting", 0, SMALL.eval_items))
    assert (fixed.answer, fixed.accuracy) == ("1", 0.65)

    def accuracy(arm, seed, k, r, d):
        if d == "letter_counting":
            return 0.65 if arm == "sharing" and r else 0.2
        return 0.2 + (0.05 if arm == "sharing" else 0.0) + 0.01 * (seed - 50)

    write_evals(o, accuracy)
    summary = summary_json(o)
    assert summary["shortcuts"] == ["letter_counting"] and summary["fixed_answers"]["chain_sum"]["accuracy"] < 0.25
    c = summary["comparisons"]["sharing"]
    # node 0 (letter_counting) gains 0.05 outside, node 1 (0.45 + 0.05) / 2: 0.15 in all
    assert c["without_shortcuts"]["mean"] == pytest.approx(0.05) and c["mean"] == pytest.approx(0.15)
    text = table_of(summary)
    assert 'letter_counting: nodes that ended exactly where the answer "1" to every item does' in text
    assert "alone 0 of 4, sharing 4 of 4." in text
    assert "Leaving out letter_counting" in text and "sharing - alone +5.0%" in text


def test_without_a_shortcut_there_is_no_sensitivity_analysis_and_with_nothing_else_left_no_number(tmp_path):
    def summary_of(design, folder, seeds=2):
        o = options(tmp_path / folder, arms=("alone", "sharing"), design=design, seeds=seeds)
        write_evals(o, lambda arm, seed, k, r, d: 0.3 + (0.1 if arm == "sharing" else 0.0))
        return summary_json(o)

    plain = summary_of(replace(SMALL, specialities=SMALL.specialities[1:]), "plain")  # the arithmetic ones
    assert plain["shortcuts"] == [] and "without_shortcuts" not in plain["comparisons"]["sharing"]
    assert "Leaving out" not in table_of(plain) and plain["comparisons"]["sharing"]["mean"] == pytest.approx(0.1)
    only = summary_of(replace(SMALL, specialities=SMALL.specialities[:1], specialists=False), "only", seeds=1)
    assert only["shortcuts"] == ["letter_counting"]  # nothing left without it: no number, no NaN
    assert all(run["primary_without_shortcuts"] is None for run in only["arms"]["sharing"]["seeds"].values())
    assert "without_shortcuts" not in only["comparisons"]["sharing"] and "nan" not in table_of(only)
    assert only["comparisons"]["sharing"]["pairs"] == 1 and only["comparisons"]["sharing"]["sd"] is None
    json.dumps(only, allow_nan=False)  # one pair: no spread, written as null


def test_the_cost_is_cpu_time_which_a_wait_does_not_inflate(tmp_path):
    """A node-round's cost is the process's CPU seconds: time spent waiting (here 2 ms a reply in
    the backend; a frozen or suspended grid alike) adds to its wall seconds only."""
    o = options(tmp_path / "exp", seeds=1, arms=("alone",))
    assert run_experiment(o, resolve_paths(tmp_path / "home"), build=lambda spec: FakeBackend(step_seconds=0.002),
                          progress=lambda s: None)
    rows = read_records(o.run_dir(SMALL.arm("alone"), 50) / "node-0" / "cpu.jsonl")
    assert [r["round"] for r in rows] == list(range(1, SMALL.rounds + 1))
    waited = 4 * 4 * 0.002  # tiny rounds: 4 questions x 4 replies
    assert all(r["wall_s"] - r["cpu_s"] > 0.8 * waited for r in rows)
    assert summary_json(o)["arms"]["alone"]["node_round_cpu_seconds"] > 0
    path = o.run_dir(SMALL.arm("alone"), 50) / "node-1" / "cpu.jsonl"
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True) if '"round": 2,' not in line))
    assert summary_json(o)["arms"]["alone"]["node_round_cpu_seconds"] is None  # a round missing: no partial mean


def test_a_grid_stopped_after_every_round_resumes_to_what_an_uninterrupted_one_gives(tmp_path):
    home = resolve_paths(tmp_path / "home")
    whole = options(tmp_path / "whole")
    assert run_experiment(whole, home, build=fake, progress=lambda s: None)
    parts, stops = options(tmp_path / "parts", minutes=1e-9), 0
    while not run_experiment(parts, home, build=fake, progress=lambda s: None):
        stops += 1  # each invocation runs one round, then stops
    assert stops >= 2 * 3 * SMALL.rounds - 1
    a, b = summary_json(whole), summary_json(parts)
    for arm in a["arms"]:
        for seed in a["arms"][arm]["seeds"]:
            assert a["arms"][arm]["seeds"][seed]["curve"] == b["arms"][arm]["seeds"][seed]["curve"]
            for k in range(parts.nodes):  # and every node saw and trained on the same peers' groups
                assert exchange_figures(whole, arm, int(seed), k) == exchange_figures(parts, arm, int(seed), k)
    assert any(f[1] for f in exchange_figures(whole, "sharing", 50, 0))  # there was something to carry over
    assert not any(s["resumed_at"] for arm in a["arms"].values() for s in arm["seeds"].values())


def exchange_figures(o, arm: str, seed: int, k: int) -> list[tuple]:
    path = o.run_dir(SMALL.arm(arm), seed) / f"node-{k}" / "state" / "metrics.jsonl"
    return [(r["round"], r["external_available"], r["external_groups"], r["external_advantage_share"])
            for r in read_records(path)]


def test_a_grid_refuses_to_go_on_under_another_plan_and_records_its_code(tmp_path):
    home = resolve_paths(tmp_path / "home")
    o = options(tmp_path / "exp", minutes=1e-9)
    assert not run_experiment(o, home, build=fake, progress=lambda s: None)
    with pytest.raises(NodeError, match="rounds"):
        run_experiment(replace(o, rounds=6), home, build=fake, progress=lambda s: None)
    with pytest.raises(NodeError, match="threads"):  # another thread count: other numerics, other speed
        run_experiment(replace(o, threads=2), home, build=fake, progress=lambda s: None)
    plan = json.loads((o.out / "plan.json").read_text())
    (o.out / "plan.json").write_text(json.dumps({k: v for k, v in plan.items() if k != "threads"}))
    assert not run_experiment(o, home, build=fake, progress=lambda s: None)  # a plan from before threads were in it
    assert json.loads((o.out / "plan.json").read_text()) == plan  # ...which holds every later invocation to them
    with pytest.raises(NodeError, match="threads"):
        run_experiment(replace(o, threads=2), home, build=fake, progress=lambda s: None)
    assert not run_experiment(replace(o, seeds=3), home, build=fake, progress=lambda s: None)  # more seeds: fine
    started = [json.loads(line) for line in (o.out / "invocations.jsonl").read_text().splitlines()]
    assert len(started) == 3 and started[-1]["seeds"] == [50, 51, 52]  # the refused ones left no trace
    assert started[-1]["arms"] == ["alone", "sharing", "alone-uniform"]
    assert started[0]["revision"] is None or len(started[0]["revision"].rstrip("+")) == 40


def test_a_chunk_starts_no_run_the_last_one_says_would_not_finish():
    chunk = Chunk(minutes=1)
    assert not chunk.no_time_for_a_run()  # nothing run yet: a chunk always moves the grid on
    chunk.rounds, chunk.last_run_s = 5, 10.0
    assert not chunk.no_time_for_a_run()
    chunk.last_run_s = 120.0
    assert chunk.no_time_for_a_run() and not chunk.over()


def test_a_kill_between_a_round_and_its_evaluation_leaves_the_evaluation_due_on_resume(tmp_path):
    home = resolve_paths(tmp_path / "home")
    o = options(tmp_path / "exp")
    assert run_experiment(o, home, build=fake, progress=lambda s: None)
    whole = summary_json(o)
    log = o.run_dir(SMALL.arm("sharing"), 50) / "node-1" / "evals.jsonl"
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1])["round"] == 4
    log.write_text("\n".join(lines[:-1]) + "\n")  # the node trained round 4, then the process died
    assert "50" not in summary_json(o)["arms"]["sharing"]["seeds"]
    assert run_experiment(o, home, build=fake, progress=lambda s: None)
    resumed, before = summary_json(o)["arms"]["sharing"]["seeds"]["50"], whole["arms"]["sharing"]["seeds"]["50"]
    assert (resumed["curve"], resumed["primary"]) == (before["curve"], before["primary"])


def test_a_grid_carried_to_a_bare_machine_as_its_archive_resumes_to_what_an_uninterrupted_one_gives(tmp_path):
    home = resolve_paths(tmp_path / "home")
    whole = options(tmp_path / "whole")
    assert run_experiment(whole, home, build=fake, progress=lambda s: None)
    first = options(tmp_path / "first-machine", minutes=1e-9)
    stops = 0
    while not run_experiment(first, home, build=fake, progress=lambda s: None):
        stops += 1  # stopped after a round of the first run, then of the next unfinished one...
        if summary_json(first)["arms"]["alone"]["seeds"]:
            break  # ...until one run has finished and the next is cut short
    assert stops and summary_json(first)["arms"]["alone"]["seeds"] and "sharing" not in summary_json(first)["arms"]
    assert not run_experiment(first, home, build=fake, progress=lambda s: None)  # the next run, cut short
    assert (first.run_dir(SMALL.arm("sharing"), 50) / "node-0" / "evals.jsonl").exists()
    archive = tmp_path / "carried" / "results.tar.gz"
    assert pack(first, archive) > 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(n.endswith("evals.jsonl") for n in names) and "base.json" in names
    assert not any("sharing" in n or "checkpoints" in n or n.endswith(".safetensors") for n in names)

    bare = replace(first, out=tmp_path / "second-machine", minutes=None)
    assert unpack(archive, bare.out) == len(names)
    assert run_experiment(bare, home, build=fake, progress=lambda s: None)
    a, b = summary_json(whole), summary_json(bare)
    for arm in a["arms"]:
        for seed in a["arms"][arm]["seeds"]:
            assert a["arms"][arm]["seeds"][seed]["curve"] == b["arms"][arm]["seeds"][seed]["curve"]


def test_statistics_find_a_known_effect_and_not_a_null_one():
    # 8 pairs, a true effect of 2 points, noise of 1 point per pair
    baseline = [0.30, 0.28, 0.33, 0.31, 0.29, 0.32, 0.30, 0.27]
    noise = [0.01, -0.012, 0.004, -0.003, 0.015, -0.008, 0.0, -0.006]
    effect = paired_difference([b + 0.02 + e for b, e in zip(baseline, noise)], baseline)
    assert effect.low > 0 and abs(effect.mean - 0.02) < 0.003 and effect.excludes_zero
    null = paired_difference([b + e for b, e in zip(baseline, noise)], baseline)
    assert null.low < 0 < null.high and not null.excludes_zero
    assert math.isclose(effect.detectable, detectable_effect(8) * effect.sd)
    assert round(t_quantile(0.975, 4), 3) == 2.776 and round(detectable_effect(5), 2) == 1.66


def test_the_last_round_is_evaluated_whatever_the_spacing():
    design = replace(SMALL, eval_every=2)
    assert design.eval_rounds(4) == [0, 2, 4] and design.eval_rounds(5) == [0, 2, 4, 5]


@pytest.mark.parametrize("name", list(DESIGNS))
def test_every_design_leaves_at_least_three_evaluations_after_its_burn_in(name):
    design = DESIGNS[name]
    assert sum(design.counted(r) for r in design.eval_rounds()) >= 3 and design.seeds >= 5
    assert not set(range(design.first_seed, design.first_seed + design.seeds)) & TUNED_SEEDS


def test_the_recorded_code_is_the_checkouts_head_and_unknown_for_a_copy_inside_another_checkout(tmp_path, monkeypatch):
    import subprocess

    from swarmling.app.commands.experiment import grid

    repo = tmp_path / "repo"
    for package in (repo, repo / ".gpu" / "pinned"):
        (package / "app" / "commands" / "experiment").mkdir(parents=True)
        (package / "app" / "commands" / "experiment" / "grid.py").write_text("")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "app"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(grid, "__file__", str(repo / "app" / "commands" / "experiment" / "grid.py"))
    assert grid.source_revision() == head
    # An older tree unpacked inside the checkout (as the pinned grid ran on a lent GPU) is not its HEAD.
    monkeypatch.setattr(grid, "__file__", str(repo / ".gpu" / "pinned" / "app" / "commands" / "experiment" / "grid.py"))
    assert grid.source_revision() is None

"""`swarmling experiment` on the fake backend: the grid runs, nodes verify and train on each
other's groups through the in-memory exchange, the outputs are written, and a rerun resumes."""

from __future__ import annotations

import json

from fakes import FakeBackend

from swarmling.app.commands.experiment import ExperimentOptions, Mix, parse_mixes, run_experiment
from swarmling.app.paths import resolve_paths


def test_mixes_scale_to_the_rounds_questions():
    assert [m.scaled(8) for m in parse_mixes("8/0,6/2,4/4,2/6")] == [(8, 0), (6, 2), (4, 4), (2, 6)]
    assert [m.scaled(4) for m in parse_mixes("8/0,4/4")] == [(4, 0), (2, 2)]


def test_an_experiment_compares_mixes_and_resumes(tmp_path):
    options = ExperimentOptions(out=tmp_path / "exp", nodes=2, rounds=3, seeds=1, mixes=(Mix(8, 0), Mix(4, 4)),
                                tiny=True, overrides=(("eval.every_rounds", 1), ("train.min_signal_groups", 0)))
    summary = run_experiment(options, resolve_paths(tmp_path / "home"), build=lambda spec: FakeBackend(),
                             show_progress=False)
    alone, shared = summary["mixes"]["8/0"], summary["mixes"]["4/4"]
    for mix in (alone, shared):
        assert [len(curve) for curve in mix["seeds"][0]["per_node_reward"]] == [3, 3]
        assert mix["cumulative_reward_mean"] is not None and mix["seeds"][0]["eval_by_round"]
    assert alone["seeds"][0]["external_advantage_share"] == 0  # nothing taken from peers
    assert shared["seeds"][0]["external_advantage_share"] > 0  # the peers' verified groups were trained on
    out = options.out
    assert {"summary.json", "table.md", "experiment.png", "experiment.svg"} <= {p.name for p in out.iterdir()}
    assert "| 4/4 |" in (out / "table.md").read_text()
    before = json.loads((out / "summary.json").read_text())
    again = run_experiment(options, resolve_paths(tmp_path / "home"), build=lambda spec: FakeBackend(),
                           show_progress=False)  # everything is checkpointed: nothing to run
    assert again["mixes"]["4/4"]["seeds"][0]["per_node_reward"] == before["mixes"]["4/4"]["seeds"][0]["per_node_reward"]

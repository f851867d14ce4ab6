"""The held-out score: a fixed evaluation set no round trains on, scored the same way every time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fakes import SETTINGS, FakeBackend, make_node, records

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.evaluation import EVAL_ITEMS, eval_tasks, score_tasks
from swarmling.app.learning.draws import RoundDraws
from swarmling.app.learning.round import run_round
from swarmling.app.learning.tasks import EVAL_SEED, load_preset, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_the_evaluation_set_is_fixed_and_never_drawn_by_a_round(name):
    tasks = eval_tasks(name)
    preset = load_preset(name)
    assert EVAL_ITEMS - len(preset.datasets) < len(tasks) <= EVAL_ITEMS
    assert {t.spec.dataset for t in tasks} == set(preset.datasets)
    assert all(t.spec.seed >= EVAL_SEED for t in tasks)
    drawn = set()
    for round_no in range(1, 26):  # 100 training tasks, drawn as rounds draw them
        outcome = run_round(round_no, FakeBackend(), preset, Curriculum(preset), SETTINGS, RoundDraws(0, round_no))
        drawn |= {g.task.spec.seed for g in outcome.groups}
    assert max(drawn) < EVAL_SEED
    assert eval_tasks(name) is tasks and [t.question for t in eval_tasks.__wrapped__(name)] == [t.question for t in tasks]


def test_a_node_scores_its_start_and_every_n_rounds(tmp_path):
    node, _ = make_node(tmp_path, **{"eval.every_rounds": 2})
    try:
        assert node.run(4) == 4
    finally:
        node.close()
    recs = records(tmp_path)
    assert [r.get("eval_of_round") for r in recs] == [0, 2, None, 4]  # the start's weights ride on round 1
    assert all(0 <= r["eval_accuracy"] <= 1 and r["eval_per_dataset"] for r in recs if "eval_of_round" in r)


def test_a_node_whose_sampler_can_switch_its_adapter_off_trains_first_and_scores_the_base_after(tmp_path):
    """The base model's evaluation costs minutes on a small CPU: where the sampler can sample the
    base model later (the CPU backend's llama.cpp, test_handoff.py), round 1 runs first and the
    base is scored at its end, with the adapter off; the record is the same as before."""
    import contextlib

    from swarmling.app.events import PhaseChanged, Preparing

    class AdapterOff(FakeBackend):
        base_now = False
        base_calls = 0

        def base_sampling(self):
            @contextlib.contextmanager
            def off():
                self.base_now = True
                try:
                    yield
                finally:
                    self.base_now = False
            return off()

        def generate(self, prompts, n, params, should_stop=None, on_progress=None):
            self.base_calls += self.base_now
            return super().generate(prompts, n, params, should_stop, on_progress)

    events: list = []
    node, _ = make_node(tmp_path, events, **{"eval.every_rounds": 2})
    built: list = []
    node._build = lambda spec: built.append(AdapterOff()) or built[-1]
    try:
        assert node.run(2) == 2
    finally:
        node.close()
    assert [r.get("eval_of_round") for r in records(tmp_path)] == [0, 2]
    base_shown = next(i for i, e in enumerate(events) if isinstance(e, Preparing) and "base model" in e.what)
    first_round = next(i for i, e in enumerate(events) if isinstance(e, PhaseChanged) and e.round == 1)
    assert first_round < base_shown  # round 1 ran before the base model was scored
    assert built[0].base_calls > 0 and not built[0].base_now  # scored with the adapter off, then on again


def test_a_restart_does_not_measure_again_the_weights_its_last_round_measured(tmp_path):
    # An evaluation costs about four rounds: a node (or an experiment resumed with more rounds)
    # restarting right after an evaluation round must not pay it twice, nor just before one (that
    # round's end measures newer weights at once); after any other round it measures its start.
    for rounds, measures_start in ((3, False), (2, False), (4, True)):
        home = tmp_path / f"after-{rounds}"
        node, _ = make_node(home, **{"eval.every_rounds": 3})
        try:
            node.run(rounds)
        finally:
            node.close()
        events = []
        node, _ = make_node(home, events, **{"eval.every_rounds": 3})
        try:
            node.run(1)
        finally:
            node.close()
        said = [e.text for e in events if "held-out accuracy after round" in getattr(e, "text", "")]
        assert any(f"after round {rounds}:" in t for t in said) is measures_start, said


def test_evaluation_of_the_same_weights_agrees_with_itself(backend):
    # Every fifth fixed item of each dataset (48 of 240): the same near-greedy path as evaluate()
    tasks = eval_tasks("starter")[::5]
    first = score_tasks(backend, tasks, prefill_answer=True, max_new_tokens=4)
    second = score_tasks(backend, tasks, prefill_answer=True, max_new_tokens=4)
    assert first.per_dataset == second.per_dataset and first.items == len(tasks)
    assert set(first.per_dataset) == set(load_preset("starter").datasets)


def test_the_eval_command_opens_a_trainer_that_neither_compiles_nor_tries_bf16():
    from swarmling.app.commands.evaluate import scoring_only
    from swarmling.app.config import load_config
    from swarmling.app.hardware import detect
    from swarmling.app.sizing import plan

    config = load_config(None, cli=[("backend.kind", "cpu"), ("train.cpu_compile", "on"), ("train.cpu_bf16", "on")])
    preset = load_preset(config.round.preset)
    node = plan(config, detect(), preset).build.cpu_trainer  # what a node would run
    assert node.compiler is not None and node.bf16
    trainer = plan(scoring_only(config), detect(), preset).build.cpu_trainer
    assert trainer.compiler is None and not trainer.bf16


@pytest.mark.slow
def test_the_eval_command_scores_the_base_model(tmp_path):
    out = subprocess.run([sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "eval", "--json",
                          "--set", "round.max_new_tokens=4", "--threads", "2"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["weights"].startswith("base model") and 0 <= result["accuracy"] <= 1
    assert set(result["per_dataset"]) == set(load_preset("starter-2").datasets)  # the default preset


def test_a_levels_question_space_and_what_one_fixed_answer_scores_on_the_fixed_set():
    from swarmling.app.learning.evaluation import fixed_set_levels, fixed_set_shortcuts, question_space

    assert question_space("starter", "leg_counting", 0) < 100 < 1000 < question_space("starter", "chain_sum", 1)
    assert fixed_set_levels("starter")["calendar_arithmetic"] == (0, 1)
    shortcuts = fixed_set_shortcuts("starter")
    assert set(shortcuts) == set(load_preset("starter").datasets)
    assert shortcuts["letter_counting"].answer == "1" and shortcuts["letter_counting"].accuracy > 0.3

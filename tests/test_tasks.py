"""Task specs regenerate the same item anywhere; presets bound what a spec may ask for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swarmling.app.learning.tasks import NONDETERMINISTIC, TaskError, TaskSpec, load_preset, preset_names, regenerate

SAPO9 = {
    "arc_1d", "basic_arithmetic", "base_conversion", "bf", "binary_matrix", "calendar_arithmetic",
    "decimal_arithmetic", "fraction_simplification", "propositional_logic",
}


def test_presets():
    assert {"starter", "sapo9"} <= set(preset_names())
    assert set(load_preset("sapo9").datasets) == SAPO9
    starter = load_preset("starter")
    assert all(len(levels) >= 2 for levels in starter.levels.values()), "starter levels must allow difficulty to rise"
    # rl-swarm's base_conversion min_value 0 yields empty items
    assert json.loads(load_preset("sapo9").levels["base_conversion"][0])["min_value"] >= 1


def specs():
    out = []
    for name in ("starter", "sapo9"):
        preset = load_preset(name)
        for i, dataset in enumerate(preset.datasets):
            out.append(preset.spec(dataset, len(preset.levels[dataset]) - 1, 1000 + i, 17 * i + 3))
    return out


def test_every_preset_item_is_non_empty():
    for spec in specs():
        task = regenerate(spec)
        assert task.question.strip()
        assert task.entry["answer"] is not None or spec.dataset == "propositional_logic"


def test_specs_regenerate_identically_in_a_fresh_process():
    here = {json.dumps(s.__dict__, sort_keys=True): regenerate(s).question_hash for s in specs()}
    code = (
        "import json, sys\n"
        "from swarmling.app.learning.tasks import TaskSpec, regenerate\n"
        "out = {}\n"
        "for key in json.load(sys.stdin):\n"
        "    out[key] = regenerate(TaskSpec(**json.loads(key))).question_hash\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a different hash seed must not matter
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(here)), capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    assert there == here


def test_answers_are_regenerated_not_trusted():
    spec = load_preset("starter").spec("chain_sum", 0, 5, 9)
    a, b = regenerate(spec), regenerate(TaskSpec(**spec.__dict__))
    assert a.entry["answer"] == b.entry["answer"]


def test_level_of_refuses_configs_outside_the_preset():
    preset = load_preset("starter")
    spec = preset.spec("chain_sum", 1, 1, 1)
    assert preset.level_of(spec) == 1
    harder = TaskSpec("starter", "chain_sum", json.dumps({"min_terms": 2, "max_terms": 50, "min_digits": 1, "max_digits": 9}), 1, 1)
    with pytest.raises(TaskError, match="outside"):
        preset.level_of(harder)
    with pytest.raises(TaskError, match="not in preset"):
        preset.level_of(TaskSpec("starter", "bf", "{}", 1, 1))
    with pytest.raises(TaskError, match="not 'starter'"):
        preset.level_of(TaskSpec("sapo9", "chain_sum", spec.config, 1, 1))


def test_bad_specs_are_refused_cleanly():
    with pytest.raises(TaskError):
        regenerate(TaskSpec("starter", sorted(NONDETERMINISTIC)[0], "{}", 1, 1))
    with pytest.raises(TaskError):
        regenerate(TaskSpec("starter", "chain_sum", json.dumps({"min_terms": 5, "max_terms": 2}), 1, 1))
    with pytest.raises(TaskError):
        regenerate(TaskSpec("starter", "chain_sum", "{}", -1, 1))

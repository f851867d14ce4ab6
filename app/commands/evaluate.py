"""`swarmling eval`: the held-out score (learning/evaluation.py) of a checkpoint or the base model."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ...backends.adapter_format import ADAPTER_CONFIG
from ..config import Config
from ..errors import NodeError
from ..hardware import detect
from ..learning.curriculum import Curriculum
from ..learning.evaluation import (SPACE_DRAWS, evaluate, fixed_set_levels, fixed_set_shortcuts, pass_at_k,
                                   question_space)
from ..learning.tasks import load_preset
from ..models import resolve_model
from ..node.backend_slot import BackendSlot, backend_spec, model_scale
from ..node.best import best_folder, read_best
from ..node.checkpoint import STATE, latest_checkpoint
from ..paths import Paths
from ..sizing import plan
from .arguments import Invocation, add_checkpoint_choice, add_config_flags, positive


def eval_command(config: Config, paths: Paths, checkpoint: Path | None, base: bool, as_json: bool,
                 best: bool = False, pass_at: int | None = None) -> int:
    """Evaluate a checkpoint (default: this home's newest; `best`: its best), or the base model,
    and print the scores; `pass_at`: pass@K instead of the near-greedy accuracy."""
    if best:
        checkpoint = best_folder(paths.checkpoints)
        if read_best(paths.checkpoints) is None:
            raise NodeError(f"no best checkpoint in {paths.checkpoints} yet (the node keeps one from its first "
                            "held-out evaluation on)")
    elif checkpoint is None and not base:
        newest = latest_checkpoint(paths.checkpoints)
        checkpoint = newest.path if newest is not None else None
    if checkpoint is not None and not (checkpoint / ADAPTER_CONFIG).exists():
        raise NodeError(f"{checkpoint} is not a swarmling checkpoint (no {ADAPTER_CONFIG} in it)")
    config = scoring_only(config)
    hardware = detect()
    preset = load_preset(config.round.preset)
    model = resolve_model(config.model.name, paths.cache_dir)
    sizing = plan(config, hardware, preset, model_scale(model))
    slot = BackendSlot(backend_spec(config, paths, sizing.build, model, seed=0), paths.checkpoints)
    backend = slot.open()
    prefill, max_new = config.reward.prefill_answer, sizing.shape.max_new_tokens
    try:
        levels = None
        if checkpoint is not None:
            backend.load_adapter(checkpoint)
            backend.hand_off()
            levels = _trained_levels(checkpoint, preset)
        if pass_at:
            result = pass_at_k(backend, preset, prefill, max_new, pass_at, config.round.temperature)
        else:
            result = evaluate(backend, preset, prefill, max_new, levels=levels)
    finally:
        slot.close()
    weights = str(checkpoint) if checkpoint is not None else f"base model {model.name}"
    if as_json:
        print(json.dumps({"weights": weights, "preset": preset.name, **asdict(result)}, indent=1))
    elif pass_at:
        print(f"pass@{result.k} of {weights} on preset {preset.name}: {result.pass_at_k:.1%} (pass@1 "
              f"{result.pass_at_1:.1%}; {result.items} items x {result.k} replies at temperature "
              f"{config.round.temperature:g}, {result.seconds:.1f} s)")
        for dataset, share in result.per_dataset.items():
            print(f"  {dataset:<24} {share:6.1%}")
    else:
        print(f"held-out accuracy of {weights} on preset {preset.name}: {result.accuracy:.1%} ± "
              f"{result.standard_error:.1%} ({result.items} items, {result.tag_rate:.0%} of replies closed the tag, "
              f"{result.seconds:.1f} s)")
        at = result.at_level
        shortcuts, levels_of = fixed_set_shortcuts(preset.name), fixed_set_levels(preset.name)
        print(f"  {'dataset':<24} {'score':>6}   one fixed answer   levels: distinct questions in {SPACE_DRAWS:,} draws")
        for dataset, accuracy in result.per_dataset.items():
            fixed = shortcuts[dataset]
            spaces = ", ".join(f"{level}: {question_space(preset.name, dataset, level):,}" for level in levels_of[dataset])
            trained = f"   at its level {result.levels[dataset]}: {at.per_dataset[dataset]:6.1%}" if at else ""
            answer = repr(fixed.answer[:8])
            print(f"  {dataset:<24} {accuracy:6.1%}   {fixed.accuracy:6.1%} {answer:<10} {spaces}{trained}")
        if at is not None:
            print(f"  at the levels it trains on: {at.accuracy:.1%} ({at.items} items)")
    return 0


def scoring_only(config: Config) -> Config:
    """The config an eval opens its backend with. An eval never trains: its trainer only carries a
    checkpoint's adapter to the sampler. So it neither builds the compiled training graphs (minutes
    of a second core on a cold cache, beside the scoring) nor checks a bf16 base it never uses."""
    train = config.train.model_copy(update={"cpu_compile": "off", "cpu_bf16": "off"})
    return config.model_copy(update={"train": train})


def _trained_levels(checkpoint: Path, preset) -> dict[str, int] | None:
    """The curriculum's levels the checkpoint was trained at (None: not a node's checkpoint)."""
    try:
        state = json.loads((checkpoint / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Curriculum.from_dict(preset, state.get("curriculum")).levels() if state.get("curriculum") else None


def eval_arguments(p) -> None:
    add_checkpoint_choice(p, base=True)
    p.add_argument("--pass-at", type=positive, metavar="K",
                   help="pass@K instead: K replies per item at the training temperature (the base model's is the "
                        "ceiling RL can be expected to approach)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_config_flags(p)


def eval_main(c: Invocation) -> int:
    a = c.args
    return eval_command(c.config, c.paths, a.checkpoint, a.base, a.json, a.best, a.pass_at)

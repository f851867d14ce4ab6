"""`swarmling eval`: the held-out score (learning/evaluation.py) of a checkpoint or the base model."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ...backends.adapter_format import ADAPTER_CONFIG
from ..config import Config
from ..errors import NodeError
from ..hardware import detect
from ..learning.evaluation import evaluate
from ..learning.tasks import load_preset
from ..models import resolve_model
from ..node.backend_slot import BackendSlot, backend_spec, model_scale
from ..node.checkpoint import latest_checkpoint
from ..paths import Paths
from ..sizing import plan


def eval_command(config: Config, paths: Paths, checkpoint: Path | None, base: bool, as_json: bool) -> int:
    """Evaluate a checkpoint (default: this home's newest), or the base model, and print the scores."""
    if checkpoint is None and not base:
        newest = latest_checkpoint(paths.checkpoints)
        checkpoint = newest.path if newest is not None else None
    if checkpoint is not None and not (checkpoint / ADAPTER_CONFIG).exists():
        raise NodeError(f"{checkpoint} is not a swarmling checkpoint (no {ADAPTER_CONFIG} in it)")
    hardware = detect()
    preset = load_preset(config.round.preset)
    model = resolve_model(config.model.name, paths.cache_dir)
    sizing = plan(config, hardware, preset, model_scale(model))
    slot = BackendSlot(backend_spec(config, paths, sizing.build, model, seed=0), paths.checkpoints)
    backend = slot.open()
    try:
        if checkpoint is not None:
            backend.load_adapter(checkpoint)
            backend.hand_off()
        result = evaluate(backend, preset, config.reward.prefill_answer, sizing.shape.max_new_tokens)
    finally:
        slot.close()
    weights = str(checkpoint) if checkpoint is not None else f"base model {model.name}"
    if as_json:
        print(json.dumps({"weights": weights, "preset": preset.name, **asdict(result)}, indent=1))
        return 0
    print(f"held-out accuracy of {weights} on preset {preset.name}: {result.accuracy:.1%} "
          f"({result.items} items, {result.tag_rate:.0%} of replies closed the tag, {result.seconds:.1f} s)")
    for dataset, accuracy in result.per_dataset.items():
        print(f"  {dataset:<24} {accuracy:6.1%}")
    return 0

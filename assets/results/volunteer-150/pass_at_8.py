"""pass@8 on the reported runs' held-out items (the volunteer design's: 40 at level 0 of each of
starter-2's six datasets, never trained on), at the training temperature, as the node samples:

    python pass_at_8.py                     # the base model
    python pass_at_8.py CHECKPOINT_FOLDER   # a run's weights (its adapter handed to the sampler)

Prints one JSON line: k, pass@1 (the mean share of right replies), pass@8, per dataset.
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

from swarmling.app.commands.experiment.designs import DESIGNS
from swarmling.app.config import load_config
from swarmling.app.hardware import detect
from swarmling.app.learning.evaluation import at_level_tasks, pass_at_k
from swarmling.app.learning.tasks import load_preset
from swarmling.app.models import resolve_model
from swarmling.app.node.backend_slot import BackendSlot, backend_spec, model_scale
from swarmling.app.paths import resolve_paths
from swarmling.app.sizing import plan

design = DESIGNS["volunteer"]
config = load_config(None, environ={}, cli=[("round.preset", design.preset), ("backend.threads", 2)])
paths = resolve_paths(None)
preset = load_preset(design.preset)
tasks = [t for d, level in design.specialities for t in at_level_tasks(preset.name, d, level, design.eval_items)]
model = resolve_model(config.model.name, paths.cache_dir)
sizing = plan(config, detect(), preset, model_scale(model))
slot = BackendSlot(backend_spec(config, paths, sizing.build, model, seed=0), paths.checkpoints)
backend = slot.open()
try:
    if len(sys.argv) > 1:
        backend.load_adapter(Path(sys.argv[1]))
        backend.hand_off()
    result = pass_at_k(backend, preset, config.reward.prefill_answer, sizing.shape.max_new_tokens, 8,
                       config.round.temperature, tasks=tasks)
finally:
    slot.close()
print(json.dumps({"weights": sys.argv[1] if len(sys.argv) > 1 else "base", **asdict(result)}))

"""`swarmling doctor`: what this machine is, what the node would run on it and why, and where
it keeps its files. Fast: it loads no model."""

from __future__ import annotations

from pathlib import Path

from .config import Config
from .defaults import resolve
from .hardware import choose_backend, detect
from .models import SHIPPED, ModelError, resolve_model
from .paths import Paths
from .tasks import load_preset


def doctor(config: Config, paths: Paths, config_file: Path) -> int:
    hw = detect()
    print("hardware")
    print(f"  system      {hw.system} ({hw.machine})")
    print(f"  cpu         {hw.cpu}: {hw.physical_cores} cores / {hw.logical_cores} threads")
    print(f"  memory      {hw.memory_total / 2**30:.1f} GiB ({hw.memory_available / 2**30:.1f} GiB free)")
    print(f"  bf16 on cpu {'yes' if hw.has_bf16_cpu else 'no'} (training runs in fp32 either way)")
    print(f"  cuda        {', '.join(hw.cuda_devices) or 'none'}")
    print(f"  apple mlx   {'yes' if hw.mlx_importable else 'no'}")
    choice = choose_backend(hw, config.backend.kind)
    print("backend")
    print(f"  {choice.name}: {choice.reason}")
    preset = load_preset(config.round.preset)
    res = resolve(config, hw, preset)
    print("round")
    print(f"  preset {preset.name} ({preset.description})")
    print(
        f"  {res.questions} questions x {res.completions} completions, up to {res.max_new_tokens} new tokens, "
        f"{res.threads} threads, training microbatch {res.microbatch_tokens} tokens"
    )
    print("model")
    status = 0
    try:
        model = resolve_model(config.model.name, paths.cache_dir)
        print(f"  {model.name}: {model.source}")
    except ModelError as exc:
        print(f"  problem: {exc}")
        status = 1
    for name, entry in SHIPPED.items():
        print(f"  available: {name} — {entry.description}")
    print("paths")
    print(f"  config file   {config_file}{'' if config_file.exists() else ' (not created; defaults in use)'}")
    for label, value in paths.as_dict().items():
        if label != "config file":
            print(f"  {label:<13} {value}")
    return status

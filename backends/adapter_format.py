"""The checkpoint's adapter format, shared by every backend so that a checkpoint moves between
them: peft's safetensors names and its `adapter_config.json` (or, for full fine-tuning, the
whole model's weights and `{"mode": "full"}`). Optimizer state is each framework's own file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .settings import LoraSettings

ADAPTER_FILE = "adapter_model.safetensors"
FULL_WEIGHTS_FILE = "model.safetensors"  # full fine-tuning: the whole model is the "adapter"
ADAPTER_CONFIG = "adapter_config.json"
TORCH_OPTIMIZER_FILE = "optimizer.pt"
MLX_OPTIMIZER_FILE = "optimizer_mlx.safetensors"


def write_lora_config(directory: Path, lora: LoraSettings) -> None:
    config = {"peft_type": "LORA", **asdict(lora), "target_modules": list(lora.target_modules)}
    (Path(directory) / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1))


def write_full_config(directory: Path) -> None:
    (Path(directory) / ADAPTER_CONFIG).write_text(json.dumps({"mode": "full"}, indent=1))


def check_adapter_config(directory: Path, lora: LoraSettings, full: bool) -> None:
    """Refuse a checkpoint trained in another mode, or with another LoRA shape, than the config
    asks for (ValueError saying which)."""
    directory = Path(directory)
    saved = json.loads((directory / ADAPTER_CONFIG).read_text())
    if (saved.get("mode") == "full") != full:
        raise ValueError(
            f"the checkpoint in {directory} was trained with train.mode = "
            f"{'full' if saved.get('mode') == 'full' else 'lora'}, but the config asks for "
            f"{'full' if full else 'lora'}"
        )
    if not full and (int(saved.get("r", -1)) != lora.r or set(saved.get("target_modules", [])) != set(lora.target_modules)):
        raise ValueError(
            f"adapter in {directory} has r={saved.get('r')} on {saved.get('target_modules')}, but the config asks "
            f"for r={lora.r} on {list(lora.target_modules)}"
        )

"""The MLX backend's checkpoint files: the adapter in the node's peft format (names mapped,
matrices transposed), so an adapter trained on a Mac loads into the CPU or CUDA backend and back,
and the optimizer state in MLX's own format (it does not move between frameworks)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .adapter_format import ADAPTER_FILE, MLX_OPTIMIZER_FILE, check_adapter_config, write_lora_config
from .settings import LoraSettings

PEFT_PREFIX = "base_model.model."


def peft_name(mlx_name: str) -> str:
    """model.layers.0.self_attn.q_proj.lora_a -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"""
    stem, part = mlx_name.rsplit(".", 1)
    return f"{PEFT_PREFIX}{stem}.{'lora_A' if part == 'lora_a' else 'lora_B'}.weight"


def save_adapter(model, lora: LoraSettings, directory: Path) -> None:
    directory = Path(directory)
    weights = {peft_name(k): mx.array(np.ascontiguousarray(np.array(v).T))
               for k, v in tree_flatten(model.trainable_parameters())}
    mx.save_safetensors(str(directory / ADAPTER_FILE), weights)
    write_lora_config(directory, lora)


def load_adapter(model, lora: LoraSettings, directory: Path) -> None:
    """ValueError when the adapter was written for another model or shape."""
    directory = Path(directory)
    check_adapter_config(directory, lora, full=False)
    stored = mx.load(str(directory / ADAPTER_FILE))
    ours = dict(tree_flatten(model.trainable_parameters()))
    missing = [k for k in ours if peft_name(k) not in stored]
    if missing:
        raise ValueError(f"the adapter in {directory} does not fit this model: {missing[:3]}")
    model.update(tree_unflatten([(k, stored[peft_name(k)].T.astype(ours[k].dtype)) for k in ours]))
    mx.eval(model.parameters())


def save_optimizer_state(optimizer, steps: int, directory: Path) -> None:
    state = dict(tree_flatten(optimizer.state))
    state["steps"] = mx.array(steps)
    mx.save_safetensors(str(Path(directory) / MLX_OPTIMIZER_FILE), state)


def load_optimizer_state(optimizer, steps: int, directory: Path) -> int:
    """The steps taken; a checkpoint from another backend has only the adapter: AdamW starts
    fresh and `steps` stays."""
    path = Path(directory) / MLX_OPTIMIZER_FILE
    if not path.exists():
        return steps
    state = mx.load(str(path))
    steps = int(state.pop("steps").item())
    optimizer.state = tree_unflatten(list(state.items()))
    return steps

"""The torch trainer's checkpoint files: the adapter (or, with full fine-tuning, every weight) in
the node's peft format, and the optimizer's state with the step count and torch's RNG. The MLX
backend writes the same adapter format (mlx_adapter_files.py), so checkpoints move between them."""

from __future__ import annotations

from pathlib import Path

import torch

from .adapter_format import (
    ADAPTER_FILE,
    FULL_WEIGHTS_FILE,
    TORCH_OPTIMIZER_FILE,
    check_adapter_config,
    write_full_config,
    write_lora_config,
)
from .settings import LoraSettings


def trained_state(model, full: bool) -> dict[str, torch.Tensor]:
    """The weights that train, copied to the CPU: the LoRA adapter's, or every weight."""
    from peft import get_peft_model_state_dict

    state = model.state_dict() if full else get_peft_model_state_dict(model)
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def save_trained_weights(model, full: bool, lora: LoraSettings, config, directory: Path) -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    if full:
        state = {k: v.contiguous() for k, v in trained_state(model, full).items()}
        # tied embeddings share storage: keep one name, as save_pretrained does
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(directory / FULL_WEIGHTS_FILE))
        write_full_config(directory)
        return
    save_file(trained_state(model, full), str(directory / ADAPTER_FILE))
    write_lora_config(directory, lora)


def load_trained_weights(model, full: bool, lora: LoraSettings, device: torch.device, directory: Path) -> None:
    """ValueError when the files were written for another model or adapter shape."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    directory = Path(directory)
    check_adapter_config(directory, lora, full)
    if full:
        state = load_file(str(directory / FULL_WEIGHTS_FILE), device=str(device))
        result = model.load_state_dict(state, strict=False)
        bad = [k for k in result.missing_keys if k != "lm_head.weight"] + list(result.unexpected_keys)
        if bad:
            raise ValueError(f"the weights in {directory} do not fit this model: {bad[:3]}")
        return
    state = load_file(str(directory / ADAPTER_FILE), device=str(device))
    result = set_peft_model_state_dict(model, state)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if missing:
        raise ValueError(f"adapter in {directory} does not fit this model: {missing[:3]}")


def save_optimizer_state(optimizer: torch.optim.Optimizer, steps: int, directory: Path) -> None:
    state = {"optimizer": optimizer.state_dict(), "steps": steps, "torch_rng": torch.get_rng_state()}
    torch.save(state, Path(directory) / TORCH_OPTIMIZER_FILE)


def load_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device, directory: Path) -> int:
    """Restores the optimizer (and torch's RNG, which LoRA dropout draws from); the steps taken."""
    state = torch.load(Path(directory) / TORCH_OPTIMIZER_FILE, map_location=device, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    if "torch_rng" in state:
        torch.set_rng_state(state["torch_rng"].cpu())
    return int(state["steps"])

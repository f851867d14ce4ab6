"""What a backend is built from, as plain frozen dataclasses: no torch or MLX import, so every
backend (and the app) can name them whichever frameworks are installed.

Every value comes from the node's configuration: `app/config/schema.py` holds the defaults, once, and
nothing here restates them (every field is required)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config's train section, read by attribute: no import at run time
    from ..app.config import TrainSection


@dataclass(frozen=True)
class LoraSettings:
    r: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @classmethod
    def from_config(cls, train: TrainSection) -> LoraSettings:
        return cls(train.lora_r, train.lora_alpha, train.lora_dropout, tuple(train.target_modules))


@dataclass(frozen=True)
class OptimSettings:
    learning_rate: float
    warmup_steps: int  # the step size rises linearly from 0 to learning_rate over these updates
    weight_decay: float
    max_grad_norm: float
    # Padded tokens (prompt + completion) per forward/backward pass; bounds peak memory.
    microbatch_tokens: int
    # Keep only each layer's input through the forward pass and recompute the rest in the
    # backward: a fraction of the activation memory for ~1.4x the training time.
    activation_checkpointing: bool

    @classmethod
    def from_config(cls, train: TrainSection, microbatch_tokens: int, activation_checkpointing: bool) -> OptimSettings:
        """Both memory settings as resolved for this machine (the config may leave them to memory)."""
        return cls(train.learning_rate, train.warmup_steps, train.weight_decay, train.max_grad_norm, microbatch_tokens,
                   activation_checkpointing)

    def step_size(self, steps_taken: int) -> float:
        """The learning rate of the next update (both trainers): linear warm-up over
        `warmup_steps`, then constant."""
        warmup = self.warmup_steps
        return self.learning_rate * min(1.0, (steps_taken + 1) / warmup) if warmup else self.learning_rate


@dataclass(frozen=True)
class GrpoSettings:
    clip_low: float
    clip_high: float
    # Cap of the truncated importance weight pi_old / pi_sampler; 0 turns the correction off.
    importance_cap: float
    # Cap of the sequence-level weight for peers' completions; 0 leaves them unweighted.
    external_importance_cap: float
    # Cap of the weight of a peer's reply with a negative advantage (0: off); see torch_grpo.py.
    external_negative_cap: float
    # The anchor to the base model (k2 per token, its gradient the reverse KL's: torch_grpo.py); 0: none.
    kl_beta: float

    @classmethod
    def from_config(cls, train: TrainSection) -> GrpoSettings:
        return cls(train.clip_low, train.clip_high, train.importance_cap, train.external_importance_cap,
                   train.external_negative_cap, train.kl_beta)


@dataclass(frozen=True)
class CpuTrainerChoice:
    """How the CPU backend's trainer runs: decided once for the machine (`app/sizing.py`), carried
    whole to `backends/cpu.py`; each reason is shown on the node's backend line."""

    bf16: bool = False  # try the trainer's base in bf16, kept if it agrees with fp32 (train.cpu_bf16)
    bf16_forced: bool = False  # ... kept whatever the start-up check finds (train.cpu_bf16 = "on")
    bf16_reason: str = ""  # why it is tried or not
    compiler: str | None = None  # torch.compile the trainer's layers with this C++ compiler; None: eager
    compile_reason: str = ""  # why they are compiled or not


@dataclass(frozen=True)
class CpuSamplerChoice:
    """Which weights the CPU backend's sampler (llama.cpp) runs: decided once for the machine
    (`app/sizing.py`); the reason is shown on the node's backend line."""

    f16: bool = False  # an F16 copy of a Q4_1 GGUF (backends/sampler_weights.py), else the file itself
    f16_any: bool = False  # with f16: of any quantized GGUF, and a failed copy is an error (= "f16")
    reason: str = ""


@dataclass(frozen=True)
class BackendSpec:
    """Everything `registry.build_backend` needs to build any backend."""

    kind: str  # a backend's name in registry.py
    model_name: str
    gguf: Path | None  # the model as a GGUF file (the CPU backend samples from it)
    hf_dir: Path | None  # the model as a Hugging Face folder; None: converted from `gguf`
    cache_dir: Path  # where the converted Hugging Face copy of a GGUF lives
    runtime_dir: Path  # this node's live files (the CPU backend's llama.cpp adapter)
    threads: int
    temperature: float
    lora: LoraSettings
    optim: OptimSettings
    grpo: GrpoSettings
    seed: int
    full: bool  # train every weight (train.mode = "full") instead of a LoRA adapter
    cpu_trainer: CpuTrainerChoice = CpuTrainerChoice()  # the CPU backend's trainer (frozen: one default serves all)
    cpu_sampler: CpuSamplerChoice = CpuSamplerChoice()  # ... and its sampler's weights

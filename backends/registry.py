"""The backends this release has, one entry each: adding a backend is an entry here plus its own
module. The config's `backend.kind` names, `auto`'s choice, the node's sizing and the factory all
read from this table. (`backends/cuda.py` calls itself "torch-cpu" when tests run its code on the
CPU: a name no config can ask for.)

No framework is imported here: each entry's `build` imports its backend's module when called."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Protocol

from .base import Backend, BackendUnavailable
from .factory import build_cpu, build_cuda, build_mlx
from .settings import BackendSpec


class Machine(Protocol):
    """What detection reads of the machine (`app.hardware.Hardware` has it)."""

    cuda_devices: tuple[str, ...]
    apple_silicon: bool
    mlx_importable: bool
    memory_total: int
    physical_cores: int

    @property
    def has_bf16_cpu(self) -> bool: ...


@dataclass(frozen=True)
class BackendKind:
    name: str  # the config's backend.kind
    label: str  # in the user's words: "the {label} trainer"
    build: Callable[[BackendSpec], Backend]  # BackendUnavailable, in words, when it cannot
    # Why `backend.kind = auto` runs this backend on `machine`, or None where it does not fit.
    # The table is in auto's order of preference, and its last entry fits every machine.
    chosen_for: Callable[[Machine], str | None]
    # What bounds a training microbatch: the GPU's own memory ("device"), or the host's, which
    # the machine's owner shares with the node ("host": the guest's limit and the user's ceiling).
    memory: Literal["device", "host"]
    # Its trainer can keep only each layer's input and recompute the rest (train.activation_checkpointing).
    checkpointing: bool
    # The trainer is the CPU's torch one: it can compile its layers and train on a bf16 base, and
    # its llama.cpp sampler's memory is estimated before a round runs.
    cpu_torch_trainer: bool


def _cuda(machine: Machine) -> str | None:
    if not machine.cuda_devices:
        return None
    return (f"found CUDA device {machine.cuda_devices[0]}: torch samples and trains LoRA on it (fp32 with TF32 "
            "matmuls, one copy of the weights)")


def _mlx(machine: Machine) -> str | None:
    if not (machine.apple_silicon and machine.mlx_importable):
        return None
    return (f"Apple Silicon with MLX: mlx-lm samples and trains LoRA on the GPU, one copy of the weights in "
            f"{machine.memory_total / 2**30:.0f} GB of unified memory")


def _cpu(machine: Machine) -> str:
    if machine.apple_silicon:
        return ("Apple Silicon, but MLX is not installed (pipx inject swarmling 'mlx' 'mlx-lm', or install "
                "swarmling[mlx]); using llama.cpp + torch on the CPU meanwhile")
    return (f"no GPU found; llama.cpp samples and torch trains LoRA on the CPU ({machine.physical_cores} cores"
            + (", with bf16 instructions" if machine.has_bf16_cpu else "") + ")")


BACKENDS: tuple[BackendKind, ...] = (
    BackendKind("cuda", "CUDA", build_cuda, _cuda, memory="device", checkpointing=True, cpu_torch_trainer=False),
    BackendKind("mlx", "MLX", build_mlx, _mlx, memory="host", checkpointing=False, cpu_torch_trainer=False),
    BackendKind("cpu", "CPU", build_cpu, _cpu, memory="host", checkpointing=True, cpu_torch_trainer=True),
)
NAMES: tuple[str, ...] = tuple(b.name for b in BACKENDS)


def backend_kind(name: str) -> BackendKind:
    """The entry `name` names; ValueError (in words) for a name this release lacks."""
    for entry in BACKENDS:
        if entry.name == name:
            return entry
    raise ValueError(f"backend {name!r} is not available in this release; choose from {', '.join(NAMES)}")


def build_backend(spec: BackendSpec) -> Backend:
    """The backend `spec.kind` names; `BackendUnavailable` (the message says what to change)
    when this machine or this configuration cannot have it."""
    try:
        entry = backend_kind(spec.kind)
    except ValueError as exc:
        raise BackendUnavailable(str(exc)) from None
    return entry.build(spec)

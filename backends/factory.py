"""How each backend is built from a `BackendSpec` (`registry.py` names which builds which), and
what it says in words when it cannot.

Each backend's module is imported only when chosen: torch, llama.cpp and MLX are heavy, and
MLX may not be installed at all."""

from __future__ import annotations

from pathlib import Path

from .base import Backend, BackendUnavailable
from .settings import BackendSpec


def build_cuda(spec: BackendSpec) -> Backend:
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"backend.kind = 'cuda', but torch {torch.__version__} sees no CUDA device: install a CUDA build of "
            "torch for your driver, or set backend.kind = 'auto'"
        )
    return torch_backend(spec, "cuda")


def torch_backend(spec: BackendSpec, device: str) -> Backend:
    """The CUDA backend's code on `device` (tests run it on "cpu", in fp32)."""
    from .cuda import BackendMemoryError, CudaBackend, CudaSettings

    settings = CudaSettings(_hf_folder(spec), spec.model_name, spec.temperature, device, spec.lora, spec.optim,
                            spec.grpo, spec.seed, full=spec.full)
    try:
        return CudaBackend(settings)
    except BackendMemoryError as exc:
        raise BackendUnavailable(str(exc)) from None


def build_mlx(spec: BackendSpec) -> Backend:
    if spec.full:
        raise BackendUnavailable("train.mode = 'full' is for the CUDA backend; the MLX backend trains a LoRA adapter")
    try:
        from .mlx import MlxBackend, MlxSettings
    except ImportError:
        raise BackendUnavailable(
            "backend.kind = 'mlx', but MLX is not installed: pip install 'swarmling[mlx]' (on Linux it runs on "
            "the CPU, slowly)"
        ) from None
    return MlxBackend(MlxSettings(_hf_folder(spec), spec.model_name, spec.temperature, spec.lora, spec.optim,
                                  spec.grpo, spec.seed))


def build_cpu(spec: BackendSpec) -> Backend:
    if spec.full:
        raise BackendUnavailable(
            "train.mode = 'full' needs the CUDA backend: on the CPU, llama.cpp samples through a LoRA adapter, "
            "so only the adapter can train; set train.mode = 'lora'"
        )
    if spec.gguf is None:
        raise BackendUnavailable(
            f"the CPU backend samples with llama.cpp, which needs a .gguf file; {spec.model_name!r} is a Hugging Face "
            "model (use it on a CUDA GPU, or convert it to GGUF)"
        )
    from .cpu import CpuBackend, CpuSettings

    return CpuBackend(
        CpuSettings(
            gguf=spec.gguf,
            model_name=spec.model_name,
            threads=spec.threads,
            cache_dir=spec.cache_dir,
            runtime_dir=spec.runtime_dir,
            temperature=spec.temperature,
            lora=spec.lora,
            optim=spec.optim,
            grpo=spec.grpo,
            seed=spec.seed,
            cpu_trainer=spec.cpu_trainer,
            cpu_sampler=spec.cpu_sampler,
        )
    )


def _hf_folder(spec: BackendSpec) -> Path:
    """The torch/MLX backends load a Hugging Face folder: the user's own, or the GGUF converted
    once into the cache."""
    if spec.hf_dir is not None:
        return spec.hf_dir
    from .hf_from_gguf import converted_folder

    return converted_folder(spec.gguf, spec.cache_dir)

"""`backends.registry.build_backend`: what it refuses, and in which words (the node shows them)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from backend_settings import grpo_settings, lora_settings, optim_settings

from swarmling.backends.base import BackendUnavailable
from swarmling.backends.registry import build_backend
from swarmling.backends.settings import BackendSpec

SPEC = BackendSpec(kind="cpu", model_name="some-model", gguf=Path("model.gguf"), hf_dir=None, cache_dir=Path("cache"),
                   runtime_dir=Path("runtime"), threads=1, temperature=1.0, lora=lora_settings(), optim=optim_settings(),
                   grpo=grpo_settings(), seed=0, full=False)


@pytest.mark.parametrize("changes, message", [
    ({"kind": "tpu"}, "backend 'tpu' is not available in this release"),
    ({"full": True}, "train.mode = 'full' needs the CUDA backend"),
    ({"gguf": None}, "the CPU backend samples with llama.cpp, which needs a .gguf file; 'some-model'"),
    ({"kind": "mlx", "full": True}, "train.mode = 'full' is for the CUDA backend; the MLX backend trains a LoRA adapter"),
], ids=["unknown kind", "cpu full", "cpu without gguf", "mlx full"])
def test_what_cannot_be_built_says_why(changes, message):
    with pytest.raises(BackendUnavailable, match=re.escape(message)):
        build_backend(replace(SPEC, **changes))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_device():
    with pytest.raises(BackendUnavailable, match="sees no CUDA device"):
        build_backend(replace(SPEC, kind="cuda"))

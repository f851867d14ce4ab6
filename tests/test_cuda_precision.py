"""The CUDA backend's precision keeps the adapter's small updates: two small steps move the policy's
log-probabilities as they move an fp32 copy's on the CPU (the exact reference). In bf16 each adapted
layer's output is rounded with the update added, and updates below half a bf16 step are lost: the
CUDA code path forced to bf16 on the CPU shows it, so the check can fail. On a machine with a GPU
the node's own precision there (fp32, TF32 matmuls) is checked too; CI has none and skips it."""

from __future__ import annotations

import pytest
import torch

from swarmling.backends.base import ChatPrompt, TrainSample
from swarmling.backends.cuda import CudaBackend, CudaSettings

from backend_settings import trainer_settings

REPLIES = [("What is 5 + 3?", "8</answer>", 1.0), ("What is 5 + 3?", "9</answer>", -1.0),
           ("How many legs does a spider have?", "8</answer>", 1.0),
           ("How many legs does a spider have?", "6</answer>", -1.0)]
pytestmark = pytest.mark.slow  # the real model, twice

AGREES = 0.25
SHORT_SYSTEM = "Reply inside <answer></answer>."  # short prompts: bf16 is slow on a CPU without bf16 instructions  # |delta - delta_fp32| / |delta_fp32| over the tokens: what "moves as it moves" allows


def _moved(folder, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Each reply token's log-prob change after two small steps (the first steps of a fresh adapter)."""
    backend = CudaBackend(CudaSettings(folder, "smollm2-135m", 1.0, device=device, seed=3, dtype=dtype,
                                       **trainer_settings()))
    samples = [TrainSample(backend.encode_prompt(ChatPrompt(SHORT_SYSTEM, q, "<answer>")), backend.tokenize(r), adv)
               for q, r, adv in REPLIES]
    before = backend.trainer.token_logprobs(samples)
    for _ in range(2):
        backend.train_step(samples)
    after = backend.trainer.token_logprobs(samples)
    backend.close()
    return torch.tensor([a - b for xs, ys in zip(after, before) for a, b in zip(xs, ys)], dtype=torch.float64)


def _disagreement(moved: torch.Tensor, reference: torch.Tensor) -> float:
    return float((moved - reference).norm() / reference.norm())


@pytest.fixture(scope="module")
def folder(hf_model):
    return hf_model


@pytest.fixture(scope="module")
def reference(folder):
    moved = _moved(folder, "cpu", torch.float32)
    assert float(moved.abs().max()) > 1e-3  # the steps did move the policy
    return moved


def test_bf16_loses_the_adapters_small_updates_so_the_check_can_fail(folder, reference):
    assert _disagreement(_moved(folder, "cpu", torch.bfloat16), reference) > AGREES


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run on a lent one: packaging/gpu/)")
def test_on_the_gpu_the_nodes_precision_moves_the_policy_as_fp32_does(folder, reference):
    assert _disagreement(_moved(folder, "cuda", CudaSettings.dtype), reference) < AGREES

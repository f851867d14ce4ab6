"""CUDA backend: torch samples and trains on one copy of the base weights (fp32, TF32 matmuls on a GPU).

Generation (`torch_generator.py`) runs on the trainer's peft model, so the adapter just trained
is the one that samples next round: hand-off is free and there is no second copy of the weights.
Training is the shared `TorchLoraTrainer`. The same code runs with `device="cpu"` (fp32), which is
how CI tests this backend without a GPU, in fp32 as on the GPU.

Models: the shipped GGUF (dequantized once by transformers, cached) or a Hugging Face model folder
(or an id already in the local Hugging Face cache: nothing is downloaded at run time).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import (
    BackendInfo,
    ChatPrompt,
    GenerationResult,
    ProgressCallback,
    SamplingParams,
    StopCheck,
)
from .chat_template import render
from .torch_generator import TorchGenerator
from .settings import GrpoSettings, LoraSettings, OptimSettings
from .torch_lora import TorchLoraTrainer
from .torch_trained import TorchTrainedBackend

log = logging.getLogger(__name__)


class BackendMemoryError(RuntimeError):
    """The model or the round does not fit the device; the message says what to change."""


@dataclass(frozen=True)
class CudaSettings:
    model_dir: Path  # a Hugging Face folder (the converted shipped GGUF, or the user's own model)
    model_name: str
    temperature: float
    device: str  # "cuda"; "cpu" runs the same code (tests, CI)
    lora: LoraSettings
    optim: OptimSettings
    grpo: GrpoSettings
    seed: int = 0
    compile_step: bool = True  # CUDA graphs for the decode step (GPU only; falls back to eager)
    full: bool = False  # train every weight instead of a LoRA adapter
    # The base's precision, GPU or not. fp32, with TF32 matmuls on the GPU: in bf16 each adapted
    # layer's output is rounded to bf16 with the adapter's update added, and an update below half
    # a bf16 step of that output is lost (the CPU's eager bf16 trainer lost them: docs/measured.md, "A
    # trainer that was not its sampler"); tests/test_cuda_precision.py measures it on either
    # device. The model is small and the round launch-bound (bench-gpu), so fp32 costs little.
    dtype: torch.dtype = torch.float32


def round_memory_bytes(config, batch: int, tokens: int, dtype_bytes: int) -> int:
    """KV cache for `batch` sequences of `tokens` (prompt + completion), plus one step's logits."""
    layers = config.num_hidden_layers
    kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * layers * kv_heads * head_dim * batch * tokens * dtype_bytes
    logits = batch * config.vocab_size * 4 * 3  # fp32 logits, log-softmax, probabilities
    return kv + logits


def check_fits(config, batch: int, tokens: int, device: str, dtype: torch.dtype) -> None:
    """Refuse a round that cannot fit before anything is allocated for it."""
    if not device.startswith("cuda"):
        return
    free, total = torch.cuda.mem_get_info(torch.device(device))
    need = round_memory_bytes(config, batch, tokens, torch.finfo(dtype).bits // 8)
    if need > 0.9 * free:
        raise BackendMemoryError(
            f"a round of {batch} sequences x {tokens} tokens needs about {need / 2**30:.1f} GiB of GPU memory, but "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB are free: lower round.questions, round.completions or "
            "round.max_new_tokens"
        )


def check_model_fits(model_dir: Path, device: str, dtype: torch.dtype, full: bool = False) -> None:
    """The weights (as stored, converted to `dtype`) plus training headroom, against free memory:
    LoRA needs little beyond the weights; full fine-tuning adds gradients and two AdamW moments."""
    if not device.startswith("cuda"):
        return
    import json

    stored = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    dtype_on_disk = json.loads((Path(model_dir) / "config.json").read_text()).get("torch_dtype") or "float32"
    bytes_on_disk = 4 if "32" in str(dtype_on_disk) else 2
    params = stored / bytes_on_disk
    need = params * (torch.finfo(dtype).bits // 8) * (4.5 if full else 1.5)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    if need > 0.9 * free:
        raise BackendMemoryError(
            f"the model in {model_dir} needs about {need / 2**30:.1f} GiB of GPU memory with training headroom"
            f"{' for full fine-tuning' if full else ''}; {free / 2**30:.1f} of {total / 2**30:.1f} GiB are free: "
            + ("use train.mode = 'lora', " if full else "") + "pick a smaller model or free the GPU"
        )


def allow_tensor_cores() -> None:
    """fp32 matmuls on the GPU's tensor cores (TF32 inputs, fp32 sums): the node's precision."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


class CudaBackend(TorchTrainedBackend):
    def __init__(self, settings: CudaSettings) -> None:
        from transformers import AutoTokenizer

        self.settings = settings
        on_gpu = settings.device.startswith("cuda")
        self.dtype = settings.dtype
        if on_gpu:
            allow_tensor_cores()
        check_model_fits(settings.model_dir, settings.device, self.dtype, settings.full)
        self.tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
        self.chat_template = self.tokenizer.chat_template if isinstance(self.tokenizer.chat_template, str) else None
        self.trainer = TorchLoraTrainer(
            settings.model_dir, settings.lora, settings.optim, settings.grpo, settings.temperature,
            device=settings.device, dtype=self.dtype, seed=settings.seed, full=settings.full,
        )
        eos = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        generation_eos = getattr(self.trainer.causal_lm.generation_config, "eos_token_id", None)
        eos |= set(generation_eos if isinstance(generation_eos, list) else [generation_eos] if generation_eos is not None else [])
        self.generator = TorchGenerator(self.trainer.model, self.tokenizer, eos, self.trainer.softcap,
                                        compile_step=on_gpu and settings.compile_step)

    def info(self) -> BackendInfo:
        dev = self.settings.device
        on_gpu = dev.startswith("cuda")
        name = torch.cuda.get_device_name(torch.device(dev)) if on_gpu else "CPU"
        memory = torch.cuda.memory_allocated(torch.device(dev)) if on_gpu else 0
        return BackendInfo(
            name="cuda" if on_gpu else "torch-cpu",
            device=name,
            model=self.settings.model_name,
            memory_bytes=memory,
            generator=f"torch batched sampling ({str(self.dtype).removeprefix('torch.')}, KV cache)",
            trainer=f"torch {torch.__version__} + "
            + ("full fine-tuning" if self.settings.full else f"LoRA r={self.settings.lora.r}")
            + f" ({self.trainer.trainable_parameters() / 1e6:.2f}M trainable), same weights as the sampler"
            + (", activation checkpointing" if self.trainer.activation_checkpointing else ""),
        )

    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        text = render(prompt, self.chat_template)
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(
        self,
        prompts: Sequence[ChatPrompt],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        ids = [self.encode_prompt(p) for p in prompts]
        longest = max(len(i) for i in ids) + params.max_new_tokens
        check_fits(self.trainer.config, len(ids) * n, longest, self.settings.device, self.dtype)
        return self.generator.generate(ids, n, params, should_stop, on_progress)

    def hand_off(self) -> float:
        # The sampler is the trainer's model: the new adapter is live already.
        start = time.perf_counter()
        if self.settings.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def close(self) -> None:
        if self.settings.device.startswith("cuda"):
            torch.cuda.empty_cache()

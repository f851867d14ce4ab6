"""The trainer's precision: an fp32 base, or a frozen bf16 base whose adapter, attention, head
and log-probabilities stay fp32 (the CPU's train.cpu_bf16). `BasePrecision` switches a loaded
model between the two; `TorchLoraTrainer` (torch_lora.py) runs its passes under it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

# oneDNN runs torch's bf16 matmuls on CPUs with AVX-512 (natively with AVX-512 BF16 or AMX) and
# keeps each primitive it creates (one per matmul shape and direction, with its own buffers) in a
# cache of 1,024 by default. A node's microbatches come in ever new token counts, so that cache
# only grew: +300 MiB resident by bench's sixth round, a 2.26 GB peak. At 32: peak 1.99 GB (one
# six-round bench), for 0.19-0.36 s more primitive creation a step, with no thrashing
# (assets/results/memory-amx/onednn-cache.md, assets/results/step-profile-amx/).
# Read at oneDNN's first primitive, so set on import (torch_lora imports this before any pass); a
# value the volunteer set wins, under either of oneDNN's spellings (it reads ONEDNN_ before DNNL_).
ONEDNN_PRIMITIVES = 32
if not {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"} & os.environ.keys():
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ONEDNN_PRIMITIVES)

FP32_ATTENTION = "swarmling_sdpa_fp32"  # the attention a bf16 base runs (see _sdpa_in_fp32)


def _sdpa_in_fp32(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on fp32 copies of a bf16 layer's queries, keys and values: on
    the CPU, torch's bf16 flash-attention backward is ~2.5x slower than its fp32 one (1.2 vs 0.48 s
    of a default step, profiled), far more than the casts cost; the output goes back to bf16."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(query.dtype), weights


def register_fp32_attention() -> None:
    """Make FP32_ATTENTION an attention implementation transformers can switch a model to."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FP32_ATTENTION, _sdpa_in_fp32)
    AttentionMaskInterface.register(FP32_ATTENTION, sdpa_mask)  # the masks SDPA takes (2D masks too)


class BasePrecision:
    """Whether the frozen base weights are bf16, and what that changes.

    bf16 (`bf16 = True`): the frozen base is cast once, so every matmul of the backbone runs in
    bf16 (several times the fp32 rate where the CPU has AVX-512 BF16 or AMX, far slower where it
    has not) on half the memory. The LoRA weights, their gradients and AdamW stay fp32 (their
    branches compute in bf16: `_lora_input_casts`), attention runs in fp32 (`_sdpa_in_fp32`), and
    so do the output head and the log-probabilities: logits reach ~30, where bf16 steps by 0.125,
    and the policy ratio, the KL and the sampler gap are differences of these logprobs. Switching
    back to fp32 reloads the base from its folder (a bf16 copy cannot give the fp32 bits back)."""

    def __init__(self, model, causal_lm, model_dir: Path, device: torch.device) -> None:
        register_fp32_attention()
        self._model, self._causal_lm = model, causal_lm  # peft's wrapper (or the model) and the model under it
        self._model_dir, self._device = Path(model_dir), device
        self._attention = causal_lm.config._attn_implementation  # the fp32 base's (restored when bf16 goes off)
        self._bf16 = False
        self.head_fp32: torch.Tensor | None = None  # the output head's fp32 copy while the base is bf16

    @property
    def bf16(self) -> bool:
        return self._bf16

    @bf16.setter
    def bf16(self, on: bool) -> None:
        if bool(on) == self._bf16:
            return
        lm = self._causal_lm
        frozen = [(name, p) for name, p in lm.named_parameters() if not p.requires_grad]
        if on:
            # The head shares its weight with the embeddings here (tied): keep an fp32 copy first.
            self.head_fp32 = lm.get_output_embeddings().weight.detach().float().clone()
            for _, p in frozen:
                p.data = p.data.to(torch.bfloat16)
            self._lora_input_casts(False)
            lm.set_attn_implementation(FP32_ATTENTION)
        else:
            self._lora_input_casts(True)
            lm.set_attn_implementation(self._attention)
            from safetensors.torch import load_file

            saved = {}
            for file in sorted(self._model_dir.glob("*.safetensors")):
                saved.update(load_file(str(file)))
            for name, p in frozen:
                p.data = saved[name.replace(".base_layer", "")].to(device=self._device, dtype=torch.float32)
            self.head_fp32 = None
        self._bf16 = bool(on)

    def _lora_input_casts(self, on: bool) -> None:
        """peft casts every activation entering a LoRA branch to the adapter's dtype (fp32): with a
        bf16 base that is two copies of the activations per adapted layer and pass, and the branch's
        matmuls in fp32. Off, the backbone runs under bf16 autocast (`backbone`), which casts the
        small fp32 adapter weights instead, once per pass; their gradients and AdamW stay fp32."""
        for module in self._model.modules():
            if hasattr(module, "cast_input_dtype_enabled"):
                module.cast_input_dtype_enabled = on

    def backbone(self):
        """The context of the backbone's pass: bf16 autocast with a bf16 base; the head and the
        log-probabilities run outside it, in fp32."""
        if self._bf16:
            return torch.autocast(self._device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

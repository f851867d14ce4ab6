"""LoRA training with the GRPO objective in torch — shared by the CPU and CUDA backends.
With `full=True` (CUDA backend, `train.mode = "full"`) every weight trains instead of an adapter.

Memory note: with a 49k-token vocabulary the logits dominate (8 × 350 × 49152 fp32 ≈ 550 MB per
copy). Only completion positions need logits, and those are computed in chunks (torch_head.py),
kept for the backward pass only while they are small.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import Abandoned, ProgressCallback, StopCheck, TrainSample, TrainStats
from .microbatches import SamplerGap, anchored_replies, own_tokens
from .settings import GrpoSettings, LoraSettings, OptimSettings
from .shared_prefix import RowBatch, attention_allowed, microbatches
from .torch_adapter_files import (
    load_optimizer_state,
    load_trained_weights,
    save_optimizer_state,
    save_trained_weights,
    trained_state,
)
from .torch_compile import CompiledLayers
from .torch_head import logits_at, per_sample_lists, token_logprobs
from .torch_precision import BasePrecision
from .torch_grpo import grpo_token_objective, k2_anchor, k3_kl, old_logprobs, token_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub at run time
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

log = logging.getLogger(__name__)
# peft asks transformers a deprecated question on every forward; nothing for our users to act on.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

LOGIT_CHUNK = 512  # completion positions per chunk of logits
# Tokens per microbatch of a pass without gradients (the KL anchor's reference, logprobs and
# surprise for the node): it keeps no activations, so it takes the whole round in a few passes,
# where bigger matmuls run faster (bf16 ones ~1.5x at 1000 rows against 180) and the per-op
# overhead of a pass is paid fewer times. A pass's peak is one layer's activations and one chunk
# of logits (~100 MB for 2048 tokens).
NO_GRAD_MICROBATCH = 2048


@dataclass
class _Microbatch:
    """A `shared_prefix.RowBatch` as tensors on the trainer's device."""

    input_ids: torch.Tensor  # (B, W)
    position_ids: torch.Tensor  # (B, W)
    attention_mask: torch.Tensor  # (B, 1, W, W) bool: True where a query may attend to a key
    scored: torch.Tensor  # (T,) flat indices of the hidden states that predict completion tokens
    targets: torch.Tensor  # (T,)
    sample_index: torch.Tensor  # (T,) which of the microbatch's samples each token belongs to
    samples: list[int]  # the batch's sample indices, in scoring order
    computed_tokens: int  # positions the model runs on, padding included


class TorchLoraTrainer:
    def __init__(
        self,
        model_dir: Path,
        lora: LoraSettings,
        optim: OptimSettings,
        grpo: GrpoSettings,
        temperature: float,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        full: bool = False,
    ) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.lora, self.optim, self.grpo, self.temperature = lora, optim, grpo, temperature
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(self.device)
        base.config.use_cache = False
        self.full = full
        if full:
            self.model = base
        else:
            config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                bias="none",
                task_type="CAUSAL_LM",
            )
            self.model = get_peft_model(base, config)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=optim.learning_rate, betas=(0.9, 0.99), weight_decay=optim.weight_decay
        )
        causal_lm = self.causal_lm
        self._backbone = causal_lm.model
        self._lm_head = causal_lm.get_output_embeddings()
        self._softcap: float | None = getattr(causal_lm.config, "final_logit_softcapping", None)
        self.steps = 0
        # This node's mean trainer-minus-sampler logprob per token on its own replies (an EMA over
        # steps): the correction that makes a peer's llama.cpp logprob comparable with ours.
        self.sampler_bias = 0.0
        # Full fine-tuning has no adapter to switch off: the anchor's reference is a frozen copy.
        self._reference = None
        if full and grpo.kl_beta > 0:
            import copy

            self._reference = copy.deepcopy(base).eval().requires_grad_(False)
        # Each prompt once per group (see shared_prefix.py); off only to measure what it saves.
        self.shared_prefix = True
        # The frozen base in fp32, or in bf16 (`bf16_base`: torch_precision.py).
        self.precision = BasePrecision(self.model, causal_lm, self.model_dir, self.device)
        self._checkpointing = False
        self.activation_checkpointing = optim.activation_checkpointing
        # The decoder layers through torch.compile (the CPU's train.cpu_compile; off until asked).
        self.compiling = CompiledLayers(self._backbone.layers, self._compiling_failed)
        # A bf16 base chosen for the compiled trainer goes back to fp32 if compiling fails: eager
        # bf16 rounds the adapter's updates away (app/sizing.cpu_bf16_choice). False: kept (forced).
        self.bf16_needs_compiling = False

    def _compiling_failed(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.bf16_base and self.bf16_needs_compiling:
            log.warning("training in fp32: bf16 needs the compiled trainer")
            self.bf16_base = False

    @property
    def activation_checkpointing(self) -> bool:
        """Per-layer activation checkpointing: each decoder layer keeps only its input and runs
        again in the backward pass."""
        return self._checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        if bool(on) == self._checkpointing:
            return
        lm = self.causal_lm
        # transformers 5.x renamed gradient_checkpointing_*; the old names still work, with a warning
        if on:
            enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
            enable({"use_reentrant": False})
            # Enabling also makes the embeddings' output require a gradient (a hook that only the
            # reentrant variant needs, and that disabling would not remove under peft): remove it.
            lm.disable_input_require_grads()
        else:
            disable = getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable
            disable()
        self._checkpointing = bool(on)

    @property
    def bf16_base(self) -> bool:
        """The frozen base weights in bf16 (the CPU's train.cpu_bf16; torch_precision.py says what
        stays fp32)."""
        return self.precision.bf16

    @bf16_base.setter
    def bf16_base(self, on: bool) -> None:
        self.precision.bf16 = on

    # ---- facts -------------------------------------------------------------------------------
    @property
    def causal_lm(self):
        """The transformers model underneath (peft wraps it for LoRA; full fine-tuning does not)."""
        return self.model if self.full else self.model.get_base_model()

    @property
    def config(self):
        return self.causal_lm.config

    @property
    def softcap(self) -> float | None:
        """The model's final-logit softcap (Gemma), which a sampler on these weights applies too."""
        return self._softcap

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.params)

    # ---- log-probabilities -------------------------------------------------------------------
    def _batches(self, samples: Sequence[TrainSample], grad: bool = True) -> list[_Microbatch]:
        """The batch in shared-prefix rows (or one sample a row with `shared_prefix` off), packed
        into microbatches under the token budget (a bigger one without gradients)."""
        budget = self.optim.microbatch_tokens if grad else max(self.optim.microbatch_tokens, NO_GRAD_MICROBATCH)
        return [self._tensors(rb) for rb in microbatches(samples, budget, self.shared_prefix)]

    def _tensors(self, rb: RowBatch) -> _Microbatch:
        def on_device(a):
            return torch.from_numpy(a).to(self.device)

        return _Microbatch(
            input_ids=on_device(rb.input_ids),
            position_ids=on_device(rb.positions),
            attention_mask=on_device(attention_allowed(rb.segments)).unsqueeze(1),
            scored=on_device(rb.scored),
            targets=on_device(rb.targets),
            sample_index=on_device(rb.owner),
            samples=rb.samples,
            computed_tokens=rb.computed_tokens,
        )

    @property
    def _head_weight(self) -> torch.Tensor:
        # The head stays fp32 with a bf16 base (its fp32 copy; see bf16_base).
        head = self.precision.head_fp32
        return head if head is not None else self._lm_head.weight

    def _chunk_surprise(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits_at(hidden, self._head_weight, self.temperature, self._softcap), dim=-1)
        entropy = -(logp.exp() * logp).sum(dim=-1)
        return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - entropy

    def _logprobs(self, mb: _Microbatch, per_chunk=None) -> torch.Tensor:
        """log pi of the microbatch's completion tokens (or `per_chunk`'s figure per token, without
        gradients), in scoring order."""
        with self.precision.backbone():
            hidden = self._backbone(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
            ).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1])[mb.scored]
        if per_chunk is None:
            return token_logprobs(hidden, self._head_weight, mb.targets, self.temperature, self._softcap, LOGIT_CHUNK)
        return torch.cat([per_chunk(hidden[start : start + LOGIT_CHUNK], mb.targets[start : start + LOGIT_CHUNK])
                          for start in range(0, hidden.shape[0], LOGIT_CHUNK)])

    def _reference_logprobs(self, samples: Sequence[TrainSample]) -> list[torch.Tensor]:
        """log pi_base of each sample's completion tokens: the adapter switched off (or the frozen
        copy, its output head included), without gradients, in the big microbatches of such passes."""
        if self._reference is not None:
            backbone, head = self._backbone, self._lm_head
            self._backbone, self._lm_head = self._reference.model, self._reference.get_output_embeddings()
            try:
                return self._per_token(samples)
            finally:
                self._backbone, self._lm_head = backbone, head
        with self.model.disable_adapter():
            return self._per_token(samples)

    def _anchor_references(self, samples: Sequence[TrainSample], anchored: Sequence[bool]) -> list[torch.Tensor]:
        """log pi_base of each anchored reply's tokens (`_reference_logprobs`), and zeros for the
        others, which the anchor leaves out: the reference pass runs on anchored replies alone."""
        chosen = [i for i, a in enumerate(anchored) if a]
        references = [torch.zeros(len(s.completion_ids), device=self.device) for s in samples]
        for i, reference in zip(chosen, self._reference_logprobs([samples[i] for i in chosen])):
            references[i] = reference
        return references

    def token_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """log pi(completion token | prefix) under the current policy, at the sampling temperature."""
        return per_sample_lists(self._per_token(samples))

    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """-log pi(token | prefix) - H(pi(. | prefix)) per completion token (Trainer.token_surprise)."""
        return per_sample_lists(self._per_token(samples, self._chunk_surprise))

    def _per_token(self, samples: Sequence[TrainSample], per_chunk=None) -> list[torch.Tensor]:
        """Each sample's figure per completion token (log pi without `per_chunk`), fp32."""
        return self.compiling.run(self._per_token_pass, samples, per_chunk)

    @torch.no_grad()
    def _per_token_pass(self, samples: Sequence[TrainSample], per_chunk) -> list[torch.Tensor]:
        was_training = self.model.training
        self.model.eval()
        try:
            result: list[torch.Tensor] = [torch.empty(0, device=self.device) for _ in samples]
            for mb in self._batches(samples, grad=False):
                lp = self._logprobs(mb, per_chunk).float()
                for local, i in enumerate(mb.samples):
                    result[i] = lp[mb.sample_index == local]
            return result
        finally:
            self.model.train(was_training)

    def _in_microbatch(self, per_sample: Sequence[torch.Tensor], mb: _Microbatch) -> torch.Tensor:
        """Per-sample token figures laid out in a microbatch's scoring order."""
        out = torch.empty(mb.targets.shape[0], dtype=torch.float32, device=self.device)
        for local, i in enumerate(mb.samples):
            out[mb.sample_index == local] = per_sample[i]
        return out

    # ---- the update --------------------------------------------------------------------------
    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        if sum(len(s.completion_ids) for s in samples) == 0:
            raise ValueError("train_step needs at least one completion token")
        return self.compiling.run(self._train_step, samples, should_stop, on_progress, proves=True)

    def _train_step(self, samples: Sequence[TrainSample], should_stop: StopCheck | None,
                    on_progress: ProgressCallback | None) -> TrainStats:
        start = time.perf_counter()
        total_tokens = sum(len(s.completion_ids) for s in samples)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = clipped = ratio_sum = ratio_dev = kl_sum = reference_s = 0.0
        negatives: list[float] = []
        gap = SamplerGap()
        tokens_done = 0
        computed = 0
        beta = self.grpo.kl_beta
        own_count = own_tokens(samples)
        on_reply, anchor_count = anchored_replies(samples, self.steps)
        anchored = beta > 0
        if anchored:
            reference_s = time.perf_counter()
            references = self._anchor_references(samples, on_reply)
            reference_s = time.perf_counter() - reference_s
        for mb in self._batches(samples):
            computed += mb.computed_tokens
            if should_stop is not None and should_stop():
                self.optimizer.zero_grad(set_to_none=True)
                raise Abandoned("training step abandoned")
            logp = self._logprobs(mb)
            owner = mb.sample_index
            batch = [samples[i] for i in mb.samples]
            adv = torch.tensor([sample.advantage for sample in batch], device=self.device)[owner]
            old = old_logprobs(batch, owner, logp)
            weight = token_weights(batch, owner, old, self.grpo, gap, self.sampler_bias, negatives)
            objective, ratio, was_clipped = grpo_token_objective(logp, old, adv, self.grpo, weight)
            if anchored:
                reference = self._in_microbatch(references, mb)
                counted = torch.tensor([on_reply[i] for i in mb.samples], device=self.device)[owner]
                # the mean over anchored tokens: the loss divides by all tokens, the others included
                objective = objective - beta * (total_tokens / anchor_count) * k2_anchor(logp, reference, counted)
                own = torch.tensor([not samples[i].from_peer and on_reply[i] for i in mb.samples], device=self.device)[owner]
                kl_sum += float(k3_kl(logp, reference, own).sum())
            loss = -objective.sum() / total_tokens
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += float(was_clipped.sum())
            ratio_sum += float(ratio.sum())
            ratio_dev = max(ratio_dev, float((ratio - 1).abs().max()))
            tokens_done += sum(len(sample.completion_ids) for sample in batch)
            if on_progress is not None:
                on_progress(tokens_done, total_tokens, tokens_done)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.optim.max_grad_norm))
        lr = self.optim.step_size(self.steps)
        if not math.isfinite(grad_norm):
            # A non-finite gradient would poison the adapter for good: skip the update instead.
            self.optimizer.zero_grad(set_to_none=True)
            log.warning("skipped an update with a non-finite gradient norm")
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.sampler_bias = gap.averaged_into(self.sampler_bias, self.steps)
        return TrainStats(
            loss=loss_sum,
            tokens=total_tokens,
            samples=len(samples),
            seconds=time.perf_counter() - start,
            grad_norm=grad_norm,
            clip_fraction=clipped / total_tokens,
            ratio_mean=ratio_sum / total_tokens,
            sampler_logprob_gap=gap.mean,
            sampler_ratio_outside=gap.outside_share,
            kl=kl_sum / anchor_count if anchored and own_count else None,  # own replies are the anchored ones
            learning_rate=lr,
            reference_seconds=reference_s,
            external_negative_weight=sum(negatives) / len(negatives) if negatives else None,
            computed_tokens=computed, ratio_max_deviation=ratio_dev,
        )

    # ---- persistence (torch_adapter_files.py) ------------------------------------------------
    def lora_state(self) -> dict[str, torch.Tensor]:
        return trained_state(self.model, self.full)

    def save_adapter(self, directory: Path) -> None:
        save_trained_weights(self.model, self.full, self.lora, self.config, directory)

    def load_adapter(self, directory: Path) -> None:
        load_trained_weights(self.model, self.full, self.lora, self.device, directory)

    def save_optimizer(self, directory: Path) -> None:
        save_optimizer_state(self.optimizer, self.steps, directory)

    def load_optimizer(self, directory: Path) -> None:
        self.steps = load_optimizer_state(self.optimizer, self.device, directory)

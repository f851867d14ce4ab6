"""MLX backend (Apple Silicon): mlx-lm samples and trains LoRA on one copy of the weights.

Like the CUDA backend, generation runs on the model being trained (base + mlx-lm's LoRA layers),
so hand-off is free and the sampled logprobs are the trainer's own. The GRPO loss is
`mlx_grpo.py`, the twin of the torch one. The adapter is saved in the node's checkpoint format
(peft safetensors: names mapped, matrices transposed), so an adapter trained on a Mac loads into
the CPU or CUDA backend and back; the optimizer state is MLX's own and does not move between
frameworks (a resumed node on another backend restarts AdamW's moments).

On Linux `mlx[cpu]` runs the same code slowly; CI uses it with tiny shapes. Generation decodes
each prompt's G completions as one batch (equal lengths, no mask needed). Training shares each
group's prompt (`mlx_passes.py`). The parts: the GRPO weights and objective in `mlx_grpo.py`,
the forward passes in `mlx_passes.py`, the checkpoint files in `mlx_adapter_files.py`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from .base import (
    Abandoned,
    Backend,
    BackendInfo,
    ChatPrompt,
    Completion,
    GenerationResult,
    ProgressCallback,
    SamplingParams,
    StopCheck,
    TrainSample,
    TrainStats,
)
from .chat_template import render
from .completion import check_sampling, generation_result
from .incremental_text import IncrementalText
from .microbatches import SamplerGap, anchored_replies, own_tokens, sampler_logprobs
from .mlx_grpo import grpo_token_objective, k2_anchor, k3_kl, token_weights
from .mlx_adapter_files import load_adapter, load_optimizer_state, save_adapter, save_optimizer_state
from .mlx_passes import logprobs
from .sequence_end import SequenceEnd
from .settings import GrpoSettings, LoraSettings, OptimSettings
from .shared_prefix import Row, completion_inputs, packed_rows

log = logging.getLogger(__name__)

# peft target names -> mlx-lm module paths inside a decoder layer
MODULE_PATHS = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
}


@dataclass(frozen=True)
class MlxSettings:
    model_dir: Path
    model_name: str
    temperature: float
    lora: LoraSettings
    optim: OptimSettings
    grpo: GrpoSettings
    seed: int = 0


def mlx_config_fixes(model_dir: Path) -> dict:
    """transformers 5 writes RoPE settings under `rope_parameters`; mlx-lm 0.32 reads the top-level
    `rope_theta` and silently falls back to 10000 without it — a different model (SmolLM2 uses
    100000: per-token logprobs differed by up to 0.96 nats until the cross-framework test caught
    it). Lift them to where mlx-lm looks."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    fixes = {}
    if "rope_theta" not in config and "rope_theta" in rope:
        fixes["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default" and "rope_scaling" not in config:
        fixes["rope_scaling"] = rope
    return fixes


class MlxBackend(Backend):
    def __init__(self, settings: MlxSettings) -> None:
        from mlx_lm import load
        from mlx_lm.tuner.utils import linear_to_lora_layers

        self.settings = settings
        mx.random.seed(settings.seed)
        self.model, self.tokenizer = load(str(settings.model_dir), model_config=mlx_config_fixes(settings.model_dir))
        self.hf_tokenizer = self.tokenizer._tokenizer
        template = getattr(self.hf_tokenizer, "chat_template", None)
        self.chat_template = template if isinstance(template, str) else None
        self.eos_ids = set(self.tokenizer.eos_token_ids)
        lora = settings.lora
        unknown = [m for m in lora.target_modules if m not in MODULE_PATHS]
        if unknown:
            raise ValueError(f"the MLX backend cannot put LoRA on {unknown}; known: {sorted(MODULE_PATHS)}")
        self.model.freeze()
        linear_to_lora_layers(self.model, len(self.model.layers), {
            "rank": lora.r, "scale": lora.alpha / lora.r, "dropout": lora.dropout,
            "keys": [MODULE_PATHS[m] for m in lora.target_modules],
        })
        self.optimizer = optim.AdamW(learning_rate=settings.optim.learning_rate, betas=[0.9, 0.99],
                                     weight_decay=settings.optim.weight_decay)
        self.steps = 0
        self.sampler_bias = 0.0  # as the torch trainer's: this node's trainer-minus-sampler logprob per token

    def info(self) -> BackendInfo:
        trainable = sum(v.size for _, v in tree_flatten(self.model.trainable_parameters()))
        return BackendInfo(
            name="mlx",
            device=f"MLX on {mx.default_device()}",
            model=self.settings.model_name,
            memory_bytes=int(mx.get_active_memory()) if hasattr(mx, "get_active_memory") else 0,
            generator="mlx-lm, each prompt's completions as one batch, KV cache",
            trainer=f"mlx + LoRA r={self.settings.lora.r} ({trainable / 1e6:.2f}M trainable), same weights as the sampler",
        )

    # ---- text ----------------------------------------------------------------------------------
    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        return self.hf_tokenizer(render(prompt, self.chat_template), add_special_tokens=True)["input_ids"]

    def tokenize(self, text: str) -> list[int]:
        return self.hf_tokenizer(text, add_special_tokens=False)["input_ids"]

    def _text(self, ids: list[int]) -> str:
        return self.hf_tokenizer.decode(ids, skip_special_tokens=True)

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[ChatPrompt],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        check_sampling(params)
        start = time.perf_counter()
        if params.seed is not None:
            mx.random.seed(params.seed)
        prompt_ids = [self.encode_prompt(p) for p in prompts]
        completions: list[Completion] = []
        generated = 0
        for ids in prompt_ids:
            row = self._complete(ids, n, params, should_stop)
            completions.extend(row)
            generated += sum(len(c.token_ids) for c in row)
            if on_progress is not None:
                on_progress(len(completions), n * len(prompt_ids), generated)
        return generation_result(prompt_ids, n, completions, start)

    def _complete(self, ids: list[int], n: int, params: SamplingParams, should_stop: StopCheck | None) -> list[Completion]:
        """`n` completions of one prompt, decoded as one batch."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        logits = self.model(mx.array([ids] * n), cache=cache)[:, -1, :]
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        ends = [SequenceEnd(params.max_new_tokens, params.stop, self.eos_ids.__contains__, IncrementalText(self._text).add)
                for _ in range(n)]
        for _ in range(params.max_new_tokens):
            if should_stop is not None and should_stop():
                for end in ends:
                    end.abandon()
                break
            scaled = logits.astype(mx.float32) / params.temperature
            token = mx.random.categorical(scaled)
            logp = mx.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - mx.logsumexp(scaled, axis=-1)
            mx.eval(token, logp)
            for i, (t, lp) in enumerate(zip(token.tolist(), logp.tolist())):
                if ends[i].reason is None:
                    toks[i].append(t)
                    lps[i].append(lp)
                    ends[i].add(t)
            if all(end.reason is not None for end in ends):
                break
            logits = self.model(token[:, None], cache=cache)[:, -1, :]
        return [Completion(self._text(t), t, lp, end.finish_reason) for t, lp, end in zip(toks, lps, ends)]

    # ---- training ------------------------------------------------------------------------------
    def token_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        return self._per_token(samples, surprise=False)

    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        return self._per_token(samples, surprise=True)

    def _per_token(self, samples: Sequence[TrainSample], surprise: bool) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in samples]
        for rows in packed_rows(samples, self.settings.optim.microbatch_tokens, self.shared_prefix):
            lp = np.array(logprobs(self.model, samples, rows, self.settings.temperature, surprise))
            i = 0
            for row in rows:
                for j in row.samples:
                    out[j] = lp[i : i + len(samples[j].completion_ids)].tolist()
                    i += len(samples[j].completion_ids)
        return out

    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        start = time.perf_counter()
        total = sum(len(s.completion_ids) for s in samples)
        if total == 0:
            raise ValueError("train_step needs at least one completion token")
        grpo = self.settings.grpo
        own_count = own_tokens(samples)
        on_reply, anchor_count = anchored_replies(samples, self.steps)  # the anchor's replies (microbatches.py)
        anchored = grpo.kl_beta > 0
        stats = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "kl": 0.0, "reference_s": 0.0}
        gap = SamplerGap()
        negatives: list[float] = []  # what the loss function weighed in the microbatch it last ran on
        weighed_negatives: list[float] = []

        def loss_fn(model, rows: list[Row], reference: mx.array | None):
            batch = [samples[i] for row in rows for i in row.samples]
            logp = logprobs(model, samples, rows, self.settings.temperature)
            given = [s.old_logprobs for s in batch]
            old = mx.stop_gradient(logp) if all(g is None for g in given) else mx.array(
                [x for s, g in zip(batch, given) for x in (g if g is not None else [float("nan")] * len(s.completion_ids))])
            old = mx.where(mx.isnan(old), mx.stop_gradient(logp), old)
            adv = mx.array([s.advantage for s in batch for _ in s.completion_ids])
            weight = token_weights(batch, old, grpo, self.sampler_bias, negatives)
            objective, ratio, clipped = grpo_token_objective(logp, old, adv, grpo, weight)
            kl = mx.zeros((1,))
            if reference is not None:
                counted = mx.array([on_reply[i] for row in rows for i in row.samples
                                    for _ in samples[i].completion_ids])
                own = mx.array([not samples[i].from_peer and on_reply[i] for row in rows for i in row.samples
                                for _ in samples[i].completion_ids])
                kl = k3_kl(logp, reference, own)
                # the mean over anchored tokens: the loss divides by all tokens, the others included
                objective = objective - grpo.kl_beta * (total / anchor_count) * k2_anchor(logp, reference, counted)
            return -objective.sum() / total, (ratio, clipped, old, kl.sum())

        grad_fn = nn.value_and_grad(self.model, loss_fn)
        grads_sum = None
        done = computed = 0
        for rows in packed_rows(samples, self.settings.optim.microbatch_tokens, self.shared_prefix):
            if should_stop is not None and should_stop():
                raise Abandoned("training step abandoned")
            batch = [samples[i] for row in rows for i in row.samples]
            reference = None
            if anchored and any(on_reply[i] for row in rows for i in row.samples):  # none anchored: no reference
                started = time.perf_counter()
                reference = self._reference_logprobs(samples, rows)
                stats["reference_s"] += time.perf_counter() - started
            negatives.clear()  # the loss function runs once per microbatch: keep what it weighed last
            (loss, (ratio, clipped, old, kl)), grads = grad_fn(self.model, rows, reference)
            computed += sum(len(row.prompt) + len(row.samples) * max(completion_inputs(samples[i]) for i in row.samples)
                            for row in rows)
            grads_sum = grads if grads_sum is None else tree_map(lambda a, b: a + b, grads_sum, grads)
            mx.eval(loss, grads_sum, ratio, clipped)
            stats["loss"] += float(loss)
            stats["clipped"] += float(clipped.sum())
            stats["ratio"] += float(ratio.sum())
            stats["kl"] += float(kl)
            weighed_negatives.extend(negatives)
            sampler = sampler_logprobs(batch)
            if sampler is not None:
                gap.add(np.array(old), sampler)
            done += sum(len(s.completion_ids) for s in batch)
            if on_progress is not None:
                on_progress(done, total, done)
        grads_sum, grad_norm = optim.clip_grad_norm(grads_sum, self.settings.optim.max_grad_norm)
        grad_norm = float(grad_norm)
        lr = self.settings.optim.step_size(self.steps)
        if not np.isfinite(grad_norm):
            log.warning("skipped an update with a non-finite gradient norm")  # as the torch trainer does
        else:
            self.optimizer.learning_rate = lr
            self.optimizer.update(self.model, grads_sum)
            mx.eval(self.model.parameters(), self.optimizer.state)
            self.steps += 1
        self.sampler_bias = gap.averaged_into(self.sampler_bias, self.steps)
        return TrainStats(
            loss=stats["loss"], tokens=total, samples=len(samples), seconds=time.perf_counter() - start,
            grad_norm=grad_norm, clip_fraction=stats["clipped"] / total, ratio_mean=stats["ratio"] / total,
            sampler_logprob_gap=gap.mean, sampler_ratio_outside=gap.outside_share,
            kl=stats["kl"] / anchor_count if anchored and own_count else None, learning_rate=lr, reference_seconds=stats["reference_s"],
            external_negative_weight=sum(weighed_negatives) / len(weighed_negatives) if weighed_negatives else None,
            computed_tokens=computed,
        )

    def _reference_logprobs(self, samples: Sequence[TrainSample], rows: Sequence[Row]) -> mx.array:
        """log pi_base of the rows' tokens: every LoRA layer's scale at 0 for one forward pass."""
        from mlx_lm.tuner.lora import LoRALinear

        layers = [m for _, m in self.model.named_modules() if isinstance(m, LoRALinear)]
        scales = [m.scale for m in layers]
        for m in layers:
            m.scale = 0.0
        try:
            reference = mx.stop_gradient(logprobs(self.model, samples, rows, self.settings.temperature))
            mx.eval(reference)
            return reference
        finally:
            for m, scale in zip(layers, scales):
                m.scale = scale

    def hand_off(self) -> float:
        return 0.0  # the sampler is the model being trained

    # ---- persistence: the node's (peft) adapter format (mlx_adapter_files.py) -------------------
    def save_adapter(self, directory: Path) -> None:
        save_adapter(self.model, self.settings.lora, directory)

    def load_adapter(self, directory: Path) -> None:
        load_adapter(self.model, self.settings.lora, directory)

    def save_state(self, directory: Path) -> None:
        save_adapter(self.model, self.settings.lora, directory)
        save_optimizer_state(self.optimizer, self.steps, directory)

    def load_state(self, directory: Path) -> None:
        load_adapter(self.model, self.settings.lora, directory)
        self.steps = load_optimizer_state(self.optimizer, self.steps, directory)

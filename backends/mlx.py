"""MLX backend (Apple Silicon): mlx-lm samples and trains LoRA on one copy of the weights.

Like the CUDA backend, generation runs on the model being trained (base + mlx-lm's LoRA layers),
so hand-off is free and the sampled logprobs are the trainer's own. The GRPO loss is
`mlx_grpo.py`, the twin of the torch one. The adapter is saved in the node's checkpoint format
(peft safetensors: names mapped, matrices transposed), so an adapter trained on a Mac loads into
the CPU or CUDA backend and back; the optimizer state is MLX's own and does not move between
frameworks (a resumed node on another backend restarts AdamW's moments).

On Linux `mlx[cpu]` runs the same code slowly; CI uses it with tiny shapes. Generation decodes
each prompt's G completions as one batch (equal lengths, no mask needed); training right-pads,
which a causal model needs no mask for either (padding only follows the real tokens).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

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
from .mlx_grpo import grpo_token_objective, truncated_importance_weight
from .settings import GrpoSettings, LoraSettings, OptimSettings
from .torch_lora import ADAPTER_CONFIG, ADAPTER_FILE

OPTIMIZER_FILE = "optimizer_mlx.safetensors"
# peft target names -> mlx-lm module paths inside a decoder layer
MODULE_PATHS = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
}
PEFT_PREFIX = "base_model.model."


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


def peft_name(mlx_name: str) -> str:
    """model.layers.0.self_attn.q_proj.lora_a -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"""
    stem, part = mlx_name.rsplit(".", 1)
    return f"{PEFT_PREFIX}{stem}.{'lora_A' if part == 'lora_a' else 'lora_B'}.weight"


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
        from mlx_lm.models.cache import make_prompt_cache

        if params.temperature <= 0:
            raise ValueError("temperature must be > 0 (RL needs the sampling distribution's logprobs)")
        start = time.perf_counter()
        if params.seed is not None:
            mx.random.seed(params.seed)
        prompt_ids = [self.encode_prompt(p) for p in prompts]
        completions, generated, finished = [], 0, 0
        for ids in prompt_ids:
            cache = make_prompt_cache(self.model)
            logits = self.model(mx.array([ids] * n), cache=cache)[:, -1, :]
            toks: list[list[int]] = [[] for _ in range(n)]
            lps: list[list[float]] = [[] for _ in range(n)]
            finish = [""] * n
            for _ in range(params.max_new_tokens):
                if should_stop is not None and should_stop():
                    finish = [f or "abandoned" for f in finish]
                    break
                scaled = logits.astype(mx.float32) / params.temperature
                token = mx.random.categorical(scaled)
                logp = mx.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - mx.logsumexp(scaled, axis=-1)
                mx.eval(token, logp)
                for i, (t, lp) in enumerate(zip(token.tolist(), logp.tolist())):
                    if finish[i]:
                        continue
                    toks[i].append(t)
                    lps[i].append(lp)
                    generated += 1
                    if t in self.eos_ids:
                        finish[i] = "eos"
                    elif params.stop and any(s in self._text(toks[i]) for s in params.stop):
                        finish[i] = "stop"
                if all(finish):
                    break
                logits = self.model(token[:, None], cache=cache)[:, -1, :]
            finished += n
            if on_progress is not None:
                on_progress(finished, n * len(prompt_ids), generated)
            completions.append([Completion(self._text(t), t, lp, f or "length") for t, lp, f in zip(toks, lps, finish)])  # type: ignore[arg-type]
        return GenerationResult(prompt_ids=prompt_ids, completions=completions, seconds=time.perf_counter() - start,
                                prefill_tokens=sum(len(p) for p in prompt_ids), generated_tokens=generated)

    # ---- training ------------------------------------------------------------------------------
    def _logprobs(self, model, samples: Sequence[TrainSample]) -> mx.array:
        """log pi(completion token | prefix) for every completion token of `samples`, concatenated."""
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        ids = np.zeros((len(samples), width), dtype=np.int32)
        rows, targets = [], []
        for b, s in enumerate(samples):
            seq = list(s.prompt_ids) + list(s.completion_ids)
            ids[b, : len(seq)] = seq  # right padding: causal attention never looks ahead at it
            p = len(s.prompt_ids)
            rows.extend(b * width + p - 1 + t for t in range(len(s.completion_ids)))
            targets.extend(s.completion_ids)
        logits = model(mx.array(ids)).astype(mx.float32) / self.settings.temperature
        flat = logits.reshape(-1, logits.shape[-1])[mx.array(rows)]
        target = mx.array(targets)[:, None]
        return mx.take_along_axis(flat, target, axis=-1)[:, 0] - mx.logsumexp(flat, axis=-1)

    def token_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        lp = np.array(self._logprobs(self.model, samples))
        out, i = [], 0
        for s in samples:
            out.append(lp[i : i + len(s.completion_ids)].tolist())
            i += len(s.completion_ids)
        return out

    def _batches(self, samples: Sequence[TrainSample]) -> list[list[int]]:
        """Longest first, into right-padded microbatches under the token budget (as the torch trainer)."""
        size = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
        groups: list[list[int]] = []
        for i in sorted(range(len(samples)), key=lambda i: -size[i]):
            if groups and (len(groups[-1]) + 1) * size[groups[-1][0]] <= self.settings.optim.microbatch_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        start = time.perf_counter()
        total = sum(len(s.completion_ids) for s in samples)
        if total == 0:
            raise ValueError("train_step needs at least one completion token")
        grpo = self.settings.grpo
        stats = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "gap": 0.0, "outside": 0.0, "known": 0.0}

        def loss_fn(model, batch: list[TrainSample]):
            logp = self._logprobs(model, batch)
            given = [s.old_logprobs for s in batch]
            old = mx.stop_gradient(logp) if all(g is None for g in given) else mx.array(
                [x for s, g in zip(batch, given) for x in (g if g is not None else [float("nan")] * len(s.completion_ids))])
            old = mx.where(mx.isnan(old), mx.stop_gradient(logp), old)
            adv = mx.array([s.advantage for s in batch for _ in s.completion_ids])
            weight = None
            behaviour = [s.behaviour_logprobs for s in batch]
            if grpo.importance_cap > 0 and all(b is not None for b in behaviour):
                weight = truncated_importance_weight(old, mx.array([x for b in behaviour for x in b]), grpo.importance_cap)
            objective, ratio, clipped = grpo_token_objective(logp, old, adv, grpo, weight)
            return -objective.sum() / total, (ratio, clipped, old)

        grad_fn = nn.value_and_grad(self.model, loss_fn)
        grads_sum = None
        done = 0
        for group in self._batches(samples):
            if should_stop is not None and should_stop():
                raise Abandoned("training step abandoned")
            batch = [samples[i] for i in group]
            (loss, (ratio, clipped, old)), grads = grad_fn(self.model, batch)
            grads_sum = grads if grads_sum is None else tree_map(lambda a, b: a + b, grads_sum, grads)
            mx.eval(loss, grads_sum, ratio, clipped)
            stats["loss"] += float(loss)
            stats["clipped"] += float(clipped.sum())
            stats["ratio"] += float(ratio.sum())
            behaviour = [x for s in batch for x in (s.behaviour_logprobs or [])]
            if len(behaviour) == int(old.size):
                delta = np.array(old) - np.array(behaviour)
                stats["gap"] += float(np.abs(delta).sum())
                stats["outside"] += float(((np.exp(delta) < 0.8) | (np.exp(delta) > 1.2)).sum())
                stats["known"] += len(behaviour)
            done += sum(len(s.completion_ids) for s in batch)
            if on_progress is not None:
                on_progress(done, total, done)
        grads_sum, grad_norm = optim.clip_grad_norm(grads_sum, self.settings.optim.max_grad_norm)
        grad_norm = float(grad_norm)
        if np.isfinite(grad_norm):
            self.optimizer.update(self.model, grads_sum)
            mx.eval(self.model.parameters(), self.optimizer.state)
            self.steps += 1
        known = stats["known"] or 1
        return TrainStats(
            loss=stats["loss"], tokens=total, samples=len(samples), seconds=time.perf_counter() - start,
            grad_norm=grad_norm, clip_fraction=stats["clipped"] / total, ratio_mean=stats["ratio"] / total,
            sampler_logprob_gap=stats["gap"] / known, sampler_ratio_outside=stats["outside"] / known,
        )

    def hand_off(self) -> float:
        return 0.0  # the sampler is the model being trained

    # ---- persistence: the node's (peft) adapter format -----------------------------------------
    def save_adapter(self, directory: Path) -> None:
        directory = Path(directory)
        weights = {peft_name(k): mx.array(np.ascontiguousarray(np.array(v).T))
                   for k, v in tree_flatten(self.model.trainable_parameters())}
        mx.save_safetensors(str(directory / ADAPTER_FILE), weights)
        lora = self.settings.lora
        config = {"peft_type": "LORA", **asdict(lora), "target_modules": list(lora.target_modules)}
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1))

    def load_adapter(self, directory: Path) -> None:
        directory = Path(directory)
        saved = json.loads((directory / ADAPTER_CONFIG).read_text())
        lora = self.settings.lora
        if saved.get("mode") == "full" or int(saved.get("r", -1)) != lora.r or \
                set(saved.get("target_modules", [])) != set(lora.target_modules):
            raise ValueError(f"the adapter in {directory} does not match this config (LoRA r={lora.r} on "
                             f"{list(lora.target_modules)}): {saved}")
        stored = mx.load(str(directory / ADAPTER_FILE))
        ours = dict(tree_flatten(self.model.trainable_parameters()))
        missing = [k for k in ours if peft_name(k) not in stored]
        if missing:
            raise ValueError(f"the adapter in {directory} does not fit this model: {missing[:3]}")
        self.model.update(tree_unflatten([(k, stored[peft_name(k)].T.astype(ours[k].dtype)) for k in ours]))
        mx.eval(self.model.parameters())

    def save_state(self, directory: Path) -> None:
        self.save_adapter(directory)
        state = dict(tree_flatten(self.optimizer.state))
        state["steps"] = mx.array(self.steps)
        mx.save_safetensors(str(Path(directory) / OPTIMIZER_FILE), state)

    def load_state(self, directory: Path) -> None:
        self.load_adapter(directory)
        path = Path(directory) / OPTIMIZER_FILE
        if path.exists():  # a checkpoint from another backend has only the adapter: AdamW starts fresh
            state = mx.load(str(path))
            self.steps = int(state.pop("steps").item())
            self.optimizer.state = tree_unflatten(list(state.items()))

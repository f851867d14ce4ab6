"""CPU backend: llama.cpp samples from the shipped GGUF, torch + peft train LoRA on the same
weights (dequantized by transformers), and each update reaches llama.cpp as a GGUF LoRA adapter
swapped in without reloading the base model.

Sampler/trainer consistency: llama.cpp on a Q4 file is not bit-for-bit the fp32 trainer (it
quantizes activations inside quantized matmuls; ≈ 6% of sampled tokens have pi_train/pi_sampler
outside [0.8, 1.2]). Where the sampler runs an F16 copy of the file (backends/sampler_weights.py,
chosen in app/sizing.py) it is 0.002 nats a token from the fp32 trainer and 0.025 from the bf16
one, but not bit-for-bit either. So the trainer never uses the sampler's logprobs as pi_old: it computes
pi_old itself (exact for its one update per round), and the sampler's logprobs only feed a
truncated importance weight min(pi_train / pi_sampler, cap) that corrects for the mismatch, plus
diagnostics reported in every round's metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch

from .bf16_check import check_bf16, check_samples
from .compile_process import ReplicaRecipe, compile_in_child
from .compile_warmup import start_background_compile, write_replica
from .base import (
    BackendInfo,
    ChatPrompt,
    GenerationResult,
    ProgressCallback,
    ReferenceDecoder,
    SamplingParams,
    StopCheck,
    TrainerSwitches,
    TrainSample,
    TrainStats,
)
from .chat_template import render
from .gguf_lora import ModelShape, write_gguf_lora
from .heap import return_freed_memory
from . import torch_compile
from .hf_from_gguf import converted_folder
from .llama_cpp_generator import LlamaCppGenerator
from .sampler_weights import sampler_weights
from .settings import CpuSamplerChoice, CpuTrainerChoice, GrpoSettings, LoraSettings, OptimSettings
from .torch_lora import TorchLoraTrainer
from .torch_trained import TorchTrainedBackend

log = logging.getLogger(__name__)

LIVE_ADAPTER = "live-adapter.gguf"


@dataclass(frozen=True)
class CpuSettings:
    gguf: Path
    model_name: str
    threads: int
    cache_dir: Path  # converted torch model, shared between nodes
    runtime_dir: Path  # this node's live adapter file
    temperature: float
    lora: LoraSettings
    optim: OptimSettings
    grpo: GrpoSettings
    seed: int = 0
    chat_template: str | None = None  # overrides the GGUF's template when given
    cpu_trainer: CpuTrainerChoice = CpuTrainerChoice()  # compiled or eager, bf16 base or fp32
    cpu_sampler: CpuSamplerChoice = CpuSamplerChoice()  # the GGUF as shipped or an F16 copy


class CpuBackend(TorchTrainedBackend):
    def __init__(self, settings: CpuSettings) -> None:
        self.settings = settings
        torch.set_num_threads(settings.threads)
        self.sampler_weights = sampler_weights(settings.gguf, settings.cache_dir, settings.threads, settings.cpu_sampler)
        self.generator = LlamaCppGenerator(self.sampler_weights.path, settings.threads)
        self.chat_template = settings.chat_template or self.generator.chat_template
        folder = converted_folder(settings.gguf, settings.cache_dir)
        self.trainer = TorchLoraTrainer(
            folder, settings.lora, settings.optim, settings.grpo, settings.temperature, device="cpu", seed=settings.seed
        )
        settings.runtime_dir.mkdir(parents=True, exist_ok=True)
        self.compile_refused = None  # why this start does not compile, though asked to
        self._bf16_when_compiled = False  # a bf16 base waiting for the background compile (below)
        compiler = settings.cpu_trainer.compiler
        if compiler:
            self.compile_refused = torch_compile.prepare(compiler, settings.cache_dir, settings.runtime_dir,
                                                         settings.threads)
            self.trainer.compiling.on = self.compile_refused is None
        self.precision = self._choose_precision(settings)
        self.trainer.bf16_needs_compiling = self.trainer.bf16_base and not settings.cpu_trainer.bf16_forced
        if self.trainer.compiling.on:
            self._compile_in_background(folder)
        cfg = self.trainer.config
        self.shape = ModelShape(
            arch=self.generator.architecture,
            n_layers=cfg.num_hidden_layers,
            n_head=cfg.num_attention_heads,
            n_head_kv=getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        )

    def _compile_in_background(self, folder: Path) -> None:
        """Eager fp32 steps until a replica's graphs are built (compile_warmup.py), then compiled,
        in bf16 where that was chosen: no step waits for the compiler, none runs eager bf16."""
        settings, trainer = self.settings, self.trainer
        bf16 = self._bf16_when_compiled = trainer.bf16_base
        trainer.compiling.on = False
        trainer.bf16_base = False

        recipe = ReplicaRecipe(settings.lora, settings.optim, settings.grpo, settings.temperature, settings.seed,
                               bf16, trainer.activation_checkpointing, settings.cpu_trainer.compiler or "",
                               settings.threads)

        def make_replica(into: Path) -> TorchLoraTrainer:
            return recipe.trainer(write_replica(folder, into))

        def in_child(replica_folder: Path, stopped) -> str:
            return compile_in_child(recipe, replica_folder, stopped,
                                    lambda: torch_compile.count_a_death(settings.runtime_dir))

        def guard(run) -> None:
            torch_compile.first_pass_guarded(settings.runtime_dir, settings.cache_dir, settings.cpu_trainer.compiler or "",
                                             True, run)

        background = start_background_compile(make_replica, torch_compile.graphs_compiled, guard, in_child)

        def when_built() -> None:
            trainer.bf16_base = bf16

        def when_failed() -> None:
            trainer.bf16_base = bf16 and settings.cpu_trainer.bf16_forced  # "on" keeps bf16, even eagerly

        trainer.compiling.build_in_background(background, when_built, when_failed)

    def _choose_precision(self, settings: CpuSettings) -> str:
        """A bf16 base where asked for and it agrees with fp32 (backends/bf16_check.py); what runs, and why."""
        if not settings.cpu_trainer.bf16:
            return settings.cpu_trainer.bf16_reason or "fp32"
        if not self.trainer.compiling.on and not settings.cpu_trainer.bf16_forced:  # app/sizing.cpu_bf16_choice says why
            return "fp32: bf16 needs the compiled trainer, which this start lacks"
        check = check_bf16(self.trainer, check_samples(self.encode_prompt, self.tokenize))
        if check.agrees:
            return f"{settings.cpu_trainer.bf16_reason}; {check.describe()}"
        if settings.cpu_trainer.bf16_forced:
            self.trainer.bf16_base = True
            log.warning("train.cpu_bf16 = on although %s", check.describe())
            return f"{settings.cpu_trainer.bf16_reason}, although {check.describe()}"
        log.warning("training in fp32: %s, beyond the tolerance", check.describe())
        return f"fp32: {check.describe()}, beyond the tolerance"

    def switches(self) -> TrainerSwitches:
        compiling = self.trainer.compiling
        compiled = (compiling.on or compiling.pending) if self.settings.cpu_trainer.compiler and not compiling.failure \
            and not self.compile_refused else None
        # While the graphs are built in the background the node runs fp32 eagerly, and will run
        # compiled (in bf16 where chosen): its switches are those it will run with.
        bf16 = self.trainer.bf16_base or (compiling.pending and self._bf16_when_compiled)
        return replace(super().switches(), bf16_base=bf16, compiled=compiled)

    def set_switches(self, switches: TrainerSwitches) -> None:
        self.trainer.compiling.adopt(wait=True)  # the background build's end must not undo a choice made now
        if self.trainer.compiling.failure:  # switches read while it built promised what failed
            switches = replace(switches, compiled=None, bf16_base=None)
        super().set_switches(switches)
        if switches.bf16_base is not None:
            self.trainer.bf16_base = switches.bf16_base
        if switches.compiled is not None:
            self.trainer.compiling.on = switches.compiled

    def info(self) -> BackendInfo:
        return BackendInfo(
            name="cpu",
            device=f"CPU, {self.settings.threads} thread{'s' if self.settings.threads != 1 else ''}",
            model=self.settings.model_name,
            memory_bytes=psutil.Process().memory_info().rss,
            generator=f"llama.cpp ({self.generator.architecture}, {self.generator.model_bytes / 1e6:.0f} MB GGUF, "
            f"{self.sampler_weights.note})",
            trainer=f"torch {torch.__version__} {'bf16 base' if self.trainer.bf16_base else 'fp32'} + LoRA r={self.settings.lora.r} "
            f"({self.trainer.trainable_parameters() / 1e6:.2f}M trainable)"
            + (", activation checkpointing" if self.trainer.activation_checkpointing else "")
            + f" [{self.precision}; {self._compilation()}]",
        )

    def _compilation(self) -> str:
        if self.trainer.compiling.failure:
            return f"eager: torch.compile failed ({self.trainer.compiling.failure})"
        if self.compile_refused:
            return f"eager: {self.compile_refused}"
        compiling, reason = self.trainer.compiling, self.settings.cpu_trainer.compile_reason
        if compiling.pending:
            return f"{reason}; graphs building in the background, eager fp32 until then"
        if compiling.built_in_background:
            seconds, graphs, how = compiling.built_in_background
            return f"{reason}; {graphs} graphs built in the background in {seconds:.0f} s ({how})"
        return reason or ("compiled" if compiling.on else "eager")

    def render(self, prompt: ChatPrompt) -> str:
        return render(prompt, self.chat_template)

    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        return self.generator.tokenize_prompt(self.render(prompt))

    def tokenize(self, text: str) -> list[int]:
        return self.generator.tokenize(text)

    def generate(
        self,
        prompts: Sequence[ChatPrompt],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        ids = [self.encode_prompt(p) for p in prompts]
        return self.generator.generate(ids, n, params, should_stop, on_progress)

    def base_sampling(self):
        return self.generator.base_weights()  # llama.cpp applies the adapter per context: off, then on

    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        # The sampler's KV cache (~0.2 GB in a default round) would sit beside the step's
        # activations at the node's peak: free it (~0.1 s to make again), and give the freed heap
        # back before and after, so that the owner sees what the node uses, not what it once did.
        self.generator.release_context()
        return_freed_memory()
        try:
            return self._guarded(lambda: super(CpuBackend, self).train_step(samples, should_stop, on_progress))
        finally:
            return_freed_memory()

    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        return self._guarded(lambda: super(CpuBackend, self).token_surprise(samples))

    def _guarded(self, run):
        """A first compiled pass leaves a marker for the next start should it crash (torch_compile.py)."""
        self.trainer.compiling.adopt()  # graphs built in the background: this pass is their first on the model
        unproven = self.trainer.compiling.on and not self.trainer.compiling.proven
        return torch_compile.first_pass_guarded(self.settings.runtime_dir, self.settings.cache_dir,
                                                self.settings.cpu_trainer.compiler or "", unproven, run)

    def hand_off(self) -> float:
        start = time.perf_counter()
        state = {k: v.numpy() for k, v in self.trainer.lora_state().items()}
        path = self.settings.runtime_dir / LIVE_ADAPTER
        write_gguf_lora(state, self.shape, self.settings.lora.alpha, path)
        self.generator.set_adapter(path)
        return time.perf_counter() - start

    def reference_decoder(self) -> ReferenceDecoder:
        return self.generator

    def close(self) -> None:
        self.trainer.compiling.abandon_build()  # its tracing must not outlive the backend (torch_compile.py)
        self.generator.close()

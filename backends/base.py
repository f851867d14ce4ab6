"""The one small interface every backend implements (CPU/llama.cpp+torch, CUDA, MLX).

The node only ever talks to a backend through this module's types, so a backend can be swapped
without touching the round. Data flows one way: prompts in, completions (with the sampler's
per-token logprobs) out (`Sampler`); training samples in, statistics out, and the adapter saved
and restored (`Trainer`); the adapter is then handed from the trainer to the sampler with
`hand_off()` (`Backend`, which is both).
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol


@dataclass(frozen=True)
class ChatPrompt:
    """One conversation to complete. `prefill` pre-starts the assistant's reply (e.g. "<answer>")."""

    system: str
    user: str
    prefill: str = ""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    # Generation of a sequence stops once its decoded text contains one of these.
    stop: tuple[str, ...] = ()
    seed: int = 0


FinishReason = Literal["stop", "eos", "length", "abandoned"]


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    # log pi_sampler(token) of each sampled token, at the sampling temperature.
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass
class GenerationResult:
    prompt_ids: list[list[int]]  # [prompt] -> token ids of the rendered prompt (with prefill)
    completions: list[list[Completion]]  # [prompt][g]
    seconds: float
    prefill_tokens: int
    generated_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class TrainSample:
    """One completion to learn from. Token ids are the trainer's own tokenizer's."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    # The sampler's per-token logprobs when this node sampled the completion itself; None for
    # completions re-tokenised from text (external rollouts).
    behaviour_logprobs: list[float] | None = None
    # pi_old per token when the caller has it (several updates per round, tests); otherwise the
    # trainer takes its current policy as pi_old, which is exact for one update per round.
    old_logprobs: list[float] | None = None
    # For a peer's completion: the sender's summed sampling logprob of the whole text, for the
    # sequence-level importance weights (train.external_importance_cap, train.external_negative_cap).
    sequence_behaviour_logprob: float | None = None
    # A peer's completion sampled by another model: its logprob is no ratio's denominator.
    from_other_model: bool = False
    # A peer's completion (any model): not a sample of this node's policy, so the KL anchor's k3
    # estimate, which holds only on the policy's own samples, leaves it out (torch_grpo.py).
    from_peer: bool = False


@dataclass
class TrainStats:
    loss: float
    tokens: int
    samples: int
    seconds: float
    grad_norm: float
    clip_fraction: float  # share of tokens whose ratio was clipped
    ratio_mean: float
    # Sampler/trainer disagreement on local samples: mean |log pi_train - log pi_sampler| and the
    # share of tokens whose ratio pi_train/pi_sampler falls outside [0.8, 1.2].
    sampler_logprob_gap: float = 0.0
    sampler_ratio_outside: float = 0.0
    kl: float | None = None  # mean k3 estimate of KL(pi || pi_base) per own token; None: no anchor, or no own reply
    learning_rate: float = 0.0  # the step size this update took (warmup included)
    reference_seconds: float = 0.0  # spent on the anchor's reference forward
    # Mean weight of peers' replies with a negative advantage (None: none in the batch).
    external_negative_weight: float | None = None
    computed_tokens: int = 0  # positions the step's passes ran on, padding included (bench's efficiency)
    ratio_max_deviation: float = 0.0  # the largest |pi / pi_old - 1| over the step's tokens (0 with one update a round)


@dataclass(frozen=True)
class BackendInfo:
    name: str  # the backend's name in registry.py ("torch-cpu": the CUDA backend's code run on the CPU in tests)
    device: str  # human-readable, e.g. "x86_64 CPU, 2 threads"
    model: str
    memory_bytes: int  # resident memory the backend is responsible for, best effort
    generator: str = ""
    trainer: str = ""


StopCheck = Callable[[], bool]
# (done, total, generated tokens so far): sequences finished while generating, completion tokens
# processed while training. Called on the backend's thread, often: keep it cheap.
ProgressCallback = Callable[[int, int, int], None]


class Sampler(abc.ABC):
    """Renders and tokenizes prompts, and samples completions with their logprobs."""

    @abc.abstractmethod
    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        """Token ids of the prompt rendered with the model's chat template (prefill included)."""

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens), e.g. to re-tokenise an external completion."""

    @abc.abstractmethod
    def generate(
        self,
        prompts: Sequence[ChatPrompt],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        """`n` completions for each prompt. If `should_stop()` turns true the call returns early with
        the unfinished completions marked "abandoned"."""

    def base_sampling(self) -> AbstractContextManager[None] | None:
        """A block within which `generate` samples the base model, the adapter off; None where this
        sampler cannot (the node then scores the base model before its first round, not after)."""
        return None


@dataclass(frozen=True)
class TrainerSwitches:
    """How a trainer computes its update, for speed and memory (the update is the same either way,
    up to rounding); `swarmling bench` times each one it offers. None: this trainer has no such
    switch."""

    # Each group's prompt once for all its completions (backends/shared_prefix.py); off only to
    # measure what that saves.
    shared_prefix: bool = True
    bf16_base: bool | None = None  # the CPU trainer's frozen base in bf16 (train.cpu_bf16)
    activation_checkpointing: bool | None = None  # recompute each layer in the backward pass
    compiled: bool | None = None  # the CPU trainer's layers through torch.compile (train.cpu_compile)


class Trainer(abc.ABC):
    """Takes GRPO updates, and saves/restores what they changed."""

    shared_prefix: bool = True

    def switches(self) -> TrainerSwitches:
        """The switches this trainer offers, as set now."""
        return TrainerSwitches(shared_prefix=self.shared_prefix)

    def set_switches(self, switches: TrainerSwitches) -> None:
        self.shared_prefix = switches.shared_prefix

    @abc.abstractmethod
    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        """One GRPO policy update on the batch. Raises `Abandoned` (and leaves the weights untouched)
        if `should_stop()` turns true before the update is applied."""

    @abc.abstractmethod
    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """For each completion token, how much more it surprises the current policy than the policy
        expects at that position: -log pi(token | prefix) - H(pi(. | prefix)), at the sampling
        temperature, without changing anything. Text the policy samples itself scores 0 on average
        whatever its entropy; text it would not write scores above (app/learning/screening.py)."""

    @abc.abstractmethod
    def save_state(self, directory: Path) -> None:
        """Write adapter + optimizer state into an existing, empty directory."""

    @abc.abstractmethod
    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote, then hand the adapter to the generator."""

    @abc.abstractmethod
    def save_adapter(self, directory: Path) -> None:
        """Write the LoRA adapter alone, in the portable checkpoint format."""

    @abc.abstractmethod
    def load_adapter(self, directory: Path) -> None: ...


@dataclass
class GenerationProfile:
    """Where the last `generate` spent its time (`swarmling bench` prints it): the engine's own
    compute (the prompts' prefill, then one decode step per token position while any reply is
    live) and everything else, which is the sampler's Python: sampling from the logits, logprobs,
    end checks, building each step's batch."""
    prefill_s: float = 0.0
    prefill_tokens: int = 0  # decoded, the shared prefix once
    decode_s: float = 0.0
    live_per_step: list[int] = field(default_factory=list)  # sequences decoded at each step
    seconds_per_step: list[float] = field(default_factory=list)  # each step's decode, beside it
    total_s: float = 0.0

    @property
    def python_s(self) -> float:
        return max(0.0, self.total_s - self.prefill_s - self.decode_s)


class ReferenceDecoder(Protocol):
    """The sampler's raw engine decoding without logprobs: the baseline `swarmling bench` compares
    the node's sampling throughput with, and where the sampler's last `generate` spent its time."""

    last_profile: GenerationProfile
    path: Path  # the GGUF file it decodes with

    @property
    def adapter_path(self) -> Path | None:
        """The LoRA adapter it decodes with, if any."""
        ...

    def reference_decode(
        self, prompt_ids: Sequence[Sequence[int]], n: int, lengths: Sequence[Sequence[int]], temperature: float, seed: int = 0
    ) -> tuple[int, float]:
        """Decode exactly `lengths[p][g]` tokens for each of `n` sequences per prompt; returns
        (tokens, seconds)."""
        ...


class Backend(Sampler, Trainer):
    """Generate with logprobs, take a training step, save/load the adapter, describe itself."""

    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    @abc.abstractmethod
    def hand_off(self) -> float:
        """Make the generator sample from the freshly trained policy; returns seconds spent."""

    def reference_decoder(self) -> ReferenceDecoder | None:
        """The benchmark's throughput baseline for this backend's sampler; None where it has none."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release native resources."""


class BackendUnavailable(RuntimeError):
    """This machine or this configuration cannot have the backend asked for; the message says
    what to change."""


class Abandoned(Exception):
    """The work in flight was abandoned on request (shutdown); nothing was changed."""

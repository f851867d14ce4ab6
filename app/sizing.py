"""Per-hardware defaults for the keys a config leaves unset, and the settings they resolve to.

Measured on a 2-core x86 CPU with the shipped 135M model (starter preset): 8 questions x 8
completions generate in ≈ 5-11 s and train in ≈ 4-11 s (`swarmling bench`): a round of ≈ 12 s on 2
threads and ≈ 22 s on the default 1 thread — well inside the 90 s budget for this class of machine.
Bigger CPUs get bigger rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.registry import backend_kind
from ..backends.settings import CpuSamplerChoice, CpuTrainerChoice
from .config import Config
from .hardware import BackendChoice, Hardware, choose_backend
from .learning.tasks import Preset


@dataclass(frozen=True)
class BuildSettings:
    """Fixed when the backend is built: a change to any of them waits for a restart."""

    kind: str  # the backend: a name in backends/registry.py
    threads: int
    microbatch_tokens: int
    activation_checkpointing: bool
    memory_limit: float | None  # bytes the CPU or MLX node sized itself to (None on CUDA)
    # The CPU trainer's base in bf16 (train.cpu_bf16: tried where the CPU has bf16 instructions,
    # or "on"), and its layers through torch.compile (train.cpu_compile): see cpu_trainer_choice.
    cpu_trainer: CpuTrainerChoice = CpuTrainerChoice()
    # The CPU sampler's weights (backend.sampler_weights): the GGUF as shipped or an F16 copy.
    cpu_sampler: CpuSamplerChoice = CpuSamplerChoice()


@dataclass(frozen=True)
class RoundShape:
    """What a round generates and trains on: the settings screen may change it between rounds."""

    questions: int
    completions: int
    max_new_tokens: int
    local_groups: int


@dataclass(frozen=True)
class Sizing:
    """What this machine runs: the backend (decided here, for the node, `swarmling eval` and
    `doctor` alike), what it is built with, and the round's shape."""

    backend: BackendChoice
    build: BuildSettings
    shape: RoundShape


# Peak resident memory of a CPU node with the shipped 135M model. It is reached while training,
# with the sampler's KV cache freed (`CpuBackend.train_step`): a fixed part (the torch weights in
# fp32, llama.cpp's weights, the runtime) plus what one training microbatch needs for its
# backward pass, which grows with its padded tokens. With per-layer activation checkpointing a
# layer keeps only its input, so a token costs well under half as much, for ~1.4x the training
# time. Measured on 2 threads, default round (`swarmling bench`'s per-pass training peak, and
# steps at 128-1024 tokens): 2.0-2.2 GB at 256 tokens, 3.6 GB at 1024; checkpointed 1.6-1.7 GB at
# 256, 1.8-1.9 at 512, 2.3-2.4 at 1024. Bigger models scale both parts by their size relative to
# the shipped one.
BASE_BYTES = 1.45e9
BYTES_PER_MICROBATCH_TOKEN = 2.5e6
CHECKPOINTED_BYTES_PER_TOKEN = 1.0e6
MIN_MICROBATCH = 128
# One group in one pass: the default round's prompt (~70 tokens) and its 8 completions fill about
# 200 tokens. Below this a group's row is split and its prompt computed again for every part, so
# under a tight ceiling checkpointing (which keeps a whole group in a pass) is the better trade.
ONE_GROUP_MICROBATCH = 256
# Sampling holds what the node keeps between steps (~1.2 GB, freed heap returned) plus llama.cpp's
# context, which grows with the round: its KV cache (23 KB a token cell in f16) and compute
# buffers, measured together at ~60 KB a cell (1.45-1.55 GB peak for the default round's ~3800).
SAMPLING_BASE_BYTES = 1.25e9
SAMPLING_BYTES_PER_CELL = 60e3
PROMPT_TOKENS = 100  # a task prompt in the chat template, generously
# Without a memory ceiling the CPU node keeps its estimated peak under this, and under a share of
# the machine's memory: a guest on a 4 GB machine leaves its owner more than half (a browser).
# Sharing prefixes makes a small microbatch cheap (a bigger microbatch only takes fewer, not
# fewer-token, passes), so nothing is lost by not using more of a big machine's memory.
GUEST_BYTES = 2.5e9
GUEST_SHARE = 0.45
DEFAULT_MICROBATCH = 2048  # the starting point the guest ceiling halves from


class ResourceError(ValueError):
    """A resource ceiling that no round can fit under; the message says what would."""


def estimate_peak_bytes(microbatch_tokens: int, model_scale: float = 1.0, checkpointing: bool = False) -> float:
    per_token = CHECKPOINTED_BYTES_PER_TOKEN if checkpointing else BYTES_PER_MICROBATCH_TOKEN
    return model_scale * (BASE_BYTES + per_token * microbatch_tokens)


def fit_microbatch(microbatch: int, ceiling_bytes: float, model_scale: float = 1.0, strict: bool = True,
                   checkpointing: bool = False) -> int:
    """The largest microbatch (halving from `microbatch`) whose estimated peak fits the ceiling.
    `strict`: a ceiling nothing fits is an error (the user's); otherwise the smallest microbatch
    (the guest default on a big model: the best that can be done without being told)."""
    def peak(tokens: int) -> float:
        return estimate_peak_bytes(tokens, model_scale, checkpointing)

    while microbatch > MIN_MICROBATCH and peak(microbatch) > ceiling_bytes:
        microbatch //= 2
    if strict and peak(microbatch) > ceiling_bytes:
        need = peak(MIN_MICROBATCH) / 1e9
        raise ResourceError(
            f"resources.max_memory_gb = {ceiling_bytes / 1e9:g} is below what this model needs even at the smallest "
            f"training microbatch{' with activation checkpointing' if checkpointing else ''} (about {need:.1f} GB): "
            "raise it, or use a smaller model"
        )
    return microbatch


def sampling_peak_bytes(questions: int, completions: int, max_new_tokens: int, model_scale: float = 1.0) -> float:
    """The CPU node's estimated peak while generating a round (llama.cpp's context at its largest)."""
    cells = questions * (PROMPT_TOKENS + completions * (max_new_tokens + 1))
    return model_scale * (SAMPLING_BASE_BYTES + SAMPLING_BYTES_PER_CELL * cells)


def guest_bytes(hw: Hardware) -> float:
    """The memory a node allows itself when no ceiling is set."""
    return min(GUEST_BYTES, GUEST_SHARE * hw.memory_total) if hw.memory_total else GUEST_BYTES


def wants_checkpointing(config: Config, limit_bytes: float, model_scale: float, binding: bool) -> bool:
    """train.activation_checkpointing, or when unset: on only under a `binding` limit (the user's
    ceiling, or the guest's share of a small machine) that cannot hold one group's pass without
    it (or the smaller microbatch the config asks for). The 2.5 GB guest cap of a big machine
    does not bind: a bigger model there keeps its speed."""
    chosen = config.train.activation_checkpointing
    if chosen is not None:
        return chosen
    one_pass = min(config.train.microbatch_tokens or ONE_GROUP_MICROBATCH, ONE_GROUP_MICROBATCH)
    return binding and estimate_peak_bytes(one_pass, model_scale) > limit_bytes


def plan(config: Config, hw: Hardware, preset: Preset, model_scale: float = 1.0) -> Sizing:
    """The backend for this machine and config, what it is built with, and the round's shape;
    ResourceError when the user's memory ceiling fits no round."""
    choice = choose_backend(hw, config.backend.kind)
    build = build_settings(config, hw, choice.name, model_scale)
    return Sizing(choice, build, round_shape(config, preset, build, model_scale))


def node_threads(config: Config, physical_cores: int) -> int:
    """The threads a node computes on: all physical cores but one by default, so that the machine's
    owner keeps a core for their own work (hyperthreads add little to matrix work)."""
    return config.backend.threads or max(1, physical_cores - 1)


def build_settings(config: Config, hw: Hardware, kind: str, model_scale: float = 1.0) -> BuildSettings:
    threads = node_threads(config, hw.physical_cores)
    ceiling = config.resources.max_memory_gb
    limit = None
    backend = backend_kind(kind)
    if backend.memory == "device":
        # On a GPU the microbatch follows device memory (logits are chunked, so activations of a
        # sub-1B model dominate): 8k tokens on an 8-16 GB card, up to 32k on an 80 GB one.
        gpu_gib = (hw.cuda_memory[0] if hw.cuda_memory else 0) / 2**30
        microbatch = config.train.microbatch_tokens or (4096 if gpu_gib < 8 else 8192 if gpu_gib < 16
                                                        else 16384 if gpu_gib < 40 else 32768)
        checkpointing = bool(config.train.activation_checkpointing)
    else:
        # Peak training memory grows with the tokens per microbatch (see BASE_BYTES): the default
        # fits the guest's limit; the gradient is the same, only accumulated in more passes. A
        # ceiling the user sets is kept to (or refused), by checkpointing first where the trainer
        # can (the CPU's; the MLX trainer has none and fits by its microbatch alone).
        limit = guest_bytes(hw) if ceiling is None else ceiling * 1e9
        asked = config.train.microbatch_tokens
        binding = ceiling is not None or (limit < GUEST_BYTES and not asked)
        checkpointing = backend.checkpointing and wants_checkpointing(config, limit, model_scale, binding)
        if ceiling is None and asked:
            microbatch = asked  # asked for, and no ceiling to keep to
        else:
            microbatch = fit_microbatch(asked or DEFAULT_MICROBATCH, limit, model_scale,
                                        strict=ceiling is not None, checkpointing=checkpointing)
    return BuildSettings(kind=kind, threads=threads, microbatch_tokens=microbatch,
                         activation_checkpointing=checkpointing, memory_limit=limit,
                         cpu_trainer=cpu_trainer_choice(config, hw) if backend.cpu_torch_trainer else CpuTrainerChoice(),
                         cpu_sampler=sampler_weights_choice(config.backend.sampler_weights, hw))


def cpu_trainer_choice(config: Config, hw: Hardware) -> CpuTrainerChoice:
    """Whether the CPU trainer compiles its layers and tries a bf16 base, and why."""
    compiler, compile_reason = cpu_compile_choice(config.train.cpu_compile, hw)
    bf16, bf16_reason = cpu_bf16_choice(config.train.cpu_bf16, hw, compiler is not None)
    return CpuTrainerChoice(bf16=bf16, bf16_forced=config.train.cpu_bf16 == "on", bf16_reason=bf16_reason,
                            compiler=compiler, compile_reason=compile_reason)


def cpu_bf16_choice(mode: str, hw: Hardware, compiled: bool) -> tuple[bool, str]:
    """Whether the CPU trainer tries a bf16 base, and why (train.cpu_bf16).

    Only compiled: eagerly, each adapted layer's output is rounded to bf16 with the adapter's
    update added, and an update smaller than half a bf16 step of that output (all of them, for
    a while) is rounded away; the trainer then computes a policy its sampler is not (measured: 0.27
    nats a token apart after two steps, against 0.08 in fp32, and a rare-success node reached 21 %
    where it had reached 50 %). Inductor keeps the sum in fp32 until the layer's end."""
    if mode == "off":
        return False, "fp32: train.cpu_bf16 = off"
    if mode == "on":
        return True, "bf16: train.cpu_bf16 = on" + ("" if hw.has_bf16_cpu else " (this CPU has no bf16 instructions: slow)") \
            + ("" if compiled else "; not compiled: the adapter's small updates are rounded away")
    if not hw.has_bf16_cpu:
        return False, "fp32: this CPU has no bf16 instructions (train.cpu_bf16 = auto)"
    if not compiled:
        return False, "fp32: bf16 needs the compiled trainer, which this start lacks (train.cpu_bf16 = auto)"
    return True, "bf16: this CPU has AVX-512 BF16 or AMX, and the trainer is compiled (train.cpu_bf16 = auto)"


def sampler_weights_choice(mode: str, hw: Hardware) -> CpuSamplerChoice:
    """Which weights the CPU sampler (llama.cpp) runs, and why (backend.sampler_weights).

    An F16 copy of a Q4_1 file (the shipped model's) where the CPU has AVX-512: measured on a 2-core AMX Xeon,
    the same prompts and reply lengths decode in 0.62x the time, and the sampler sits 0.002 nats a
    token from the fp32 trainer instead of 0.054 (backends/sampler_weights.py). llama.cpp's F16
    kernels there use AVX-512F alone, so an AVX-512 EPYC runs the same code. Measured on 2 cores
    only: a decode step with one live reply reads the whole copy (2.8x the bytes), so the copy wins
    on batches, not on a lone reply. Not on AVX2-only CPUs: unmeasured there ("f16" to try it;
    `swarmling bench` times the shipped file beside the copy)."""
    if mode == "shipped":
        return CpuSamplerChoice(reason="backend.sampler_weights = shipped")
    if mode == "f16":
        return CpuSamplerChoice(f16=True, f16_any=True, reason="backend.sampler_weights = f16")
    if "avx512f" not in hw.cpu_flags:
        return CpuSamplerChoice(reason="this CPU has no AVX-512 (backend.sampler_weights = auto)")
    return CpuSamplerChoice(f16=True, reason="this CPU has AVX-512 (backend.sampler_weights = auto)")


def cpu_compile_choice(mode: str, hw: Hardware) -> tuple[str | None, str]:
    """The C++ compiler the CPU trainer's torch.compile builds with, or None; and why
    (train.cpu_compile). CUDA and MLX never compile: unmeasured there."""
    if mode == "off":
        return None, "eager: train.cpu_compile = off"
    if hw.cxx_compiler:
        return hw.cxx_compiler, f"compiled: {hw.cxx_compiler} (train.cpu_compile = {mode})"
    if mode == "on":
        return "g++", "compiled: train.cpu_compile = on, though no C++ compiler was found (it falls back if that fails)"
    return None, "eager: no C++ compiler found for torch.compile (train.cpu_compile = auto)"


def reply_tokens(config: Config, preset: Preset) -> int:
    """The longest reply the node samples (and evaluates, and `ask` or an export decodes)."""
    return config.round.max_new_tokens or preset.max_new_tokens


def round_shape(config: Config, preset: Preset, build: BuildSettings, model_scale: float = 1.0) -> RoundShape:
    """The round's shape as configured, with what was left to the hardware filled in (bigger
    rounds where there are more threads); ResourceError when generating it would not fit under
    the user's memory ceiling on the CPU backend."""
    questions = config.round.questions or (8 if build.threads <= 4 else 16)
    completions = config.round.completions or 8
    max_new_tokens = reply_tokens(config, preset)
    ceiling = config.resources.max_memory_gb
    if ceiling is not None and backend_kind(build.kind).cpu_torch_trainer:
        sampling = sampling_peak_bytes(questions, completions, max_new_tokens, model_scale)
        if sampling > ceiling * 1e9:
            raise ResourceError(
                f"resources.max_memory_gb = {ceiling:g} is below what generating a round of {questions} questions "
                f"x {completions} completions x {max_new_tokens} new tokens needs (about {sampling / 1e9:.1f} GB): "
                "lower round.questions, round.completions or round.max_new_tokens, or raise the ceiling"
            )
    # SAPO's I local + J external: by default the questions a round generates split between the
    # two (8 questions -> 4 local + 4 external, the paper's best mix).
    local = config.round.local_groups
    return RoundShape(questions=questions, completions=completions, max_new_tokens=max_new_tokens,
                      local_groups=max(1, questions - config.round.external_groups) if local is None else local)


def memory_note(config: Config, build: BuildSettings, model_scale: float = 1.0) -> str | None:
    """What the memory limit (the user's ceiling, or the guest's share of a small machine) made of
    training, for the user; None when nothing was chosen for them."""
    notes = []
    backend = backend_kind(build.kind)
    if not backend.checkpointing and config.train.activation_checkpointing:
        notes.append(f"train.activation_checkpointing is not implemented by the {backend.label} trainer: it keeps every "
                     "activation (a smaller train.microbatch_tokens uses less memory)")
    ceiling = config.resources.max_memory_gb
    chose_checkpointing = build.activation_checkpointing and config.train.activation_checkpointing is None
    sized = ceiling is not None and config.train.microbatch_tokens is None
    if build.memory_limit is not None and (chose_checkpointing or sized):
        mb, ckpt = build.microbatch_tokens, build.activation_checkpointing
        limit = (f"memory ceiling {ceiling:g} GB" if ceiling is not None
                 else f"a guest's share of this machine ({build.memory_limit / 1e9:.1f} GB)")
        notes.append(f"{limit}: training microbatch {mb} tokens{', activation checkpointing' if ckpt else ''} "
                     f"(estimated peak {estimate_peak_bytes(mb, model_scale, ckpt) / 1e9:.1f} GB)")
    return "; ".join(notes) or None

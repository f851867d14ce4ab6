"""Per-hardware defaults for the keys a config leaves unset, and the settings they resolve to.

Measured on a 2-core x86 CPU with the shipped 135M model (starter preset): 8 questions x 8
completions generate in ≈ 10 s and train in ≈ 20 s, so a default round takes ≈ 30-35 s —
well inside the 90 s budget for this class of machine. Bigger CPUs get bigger rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .hardware import Hardware
from .tasks import Preset


@dataclass(frozen=True)
class Resolved:
    threads: int
    questions: int
    completions: int
    max_new_tokens: int
    local_groups: int
    microbatch_tokens: int


# Peak resident memory of a CPU node with the shipped 135M model, re-measured with shared-prefix
# training: a fixed part (the torch weights in fp32, llama.cpp's model and context, the runtime)
# plus the saved activations of one training microbatch, which grow with its padded tokens
# (~2.5 MB each in fp32, from the trainer alone at 256-2048 tokens; the 49k-vocab logits are
# chunked). `swarmling bench`, default round on 2 cores: 2.26 GB peak at 256 tokens. Bigger
# models scale both parts by their size relative to the shipped one.
BASE_BYTES = 1.6e9
BYTES_PER_MICROBATCH_TOKEN = 2.5e6
MIN_MICROBATCH = 128
# Without a memory ceiling the CPU node keeps its estimated peak under this: a guest on a 4 GB
# machine leaves its owner 1.5 GB (a browser). Sharing prefixes makes a small microbatch cheap
# (one group's prompt and completions is ~200 tokens in the default round; a bigger microbatch
# only takes fewer, not fewer-token, passes), so nothing is lost by not using the machine's memory.
GUEST_BYTES = 2.5e9
DEFAULT_MICROBATCH = 2048  # the starting point the guest ceiling halves from


class ResourceError(ValueError):
    """A resource ceiling that no round can fit under; the message says what would."""


def estimate_peak_bytes(microbatch_tokens: int, model_scale: float = 1.0) -> float:
    return model_scale * (BASE_BYTES + BYTES_PER_MICROBATCH_TOKEN * microbatch_tokens)


def fit_microbatch(microbatch: int, ceiling_bytes: float, model_scale: float = 1.0, strict: bool = True) -> int:
    """The largest microbatch (halving from `microbatch`) whose estimated peak fits the ceiling.
    `strict`: a ceiling nothing fits is an error (the user's); otherwise the smallest microbatch
    (the guest default on a big model: the best that can be done without being told)."""
    while microbatch > MIN_MICROBATCH and estimate_peak_bytes(microbatch, model_scale) > ceiling_bytes:
        microbatch //= 2
    if strict and estimate_peak_bytes(microbatch, model_scale) > ceiling_bytes:
        need = estimate_peak_bytes(MIN_MICROBATCH, model_scale) / 1e9
        raise ResourceError(
            f"resources.max_memory_gb = {ceiling_bytes / 1e9:g} is below what this model needs even at the smallest "
            f"training microbatch (about {need:.1f} GB): raise it, or use a smaller model"
        )
    return microbatch


def resolve(config: Config, hw: Hardware, preset: Preset, model_scale: float = 1.0) -> Resolved:
    # All cores but one by default: the machine's owner keeps a core for their own work.
    threads = config.backend.threads or max(1, hw.physical_cores - 1)
    small = threads <= 4
    questions = config.round.questions or (8 if small else 16)
    completions = config.round.completions or 8
    # Peak training memory grows with the tokens per microbatch (see BASE_BYTES): the default
    # fits the guest ceiling; the gradient is the same, only accumulated in more passes.
    ceiling = config.resources.max_memory_gb
    guest = GUEST_BYTES if ceiling is None else ceiling * 1e9
    microbatch = config.train.microbatch_tokens or fit_microbatch(DEFAULT_MICROBATCH, guest, model_scale, strict=False)
    if hw.cuda_devices and config.backend.kind in ("auto", "cuda"):
        # On a GPU the microbatch follows device memory (logits are chunked, so activations of a
        # sub-1B model dominate): 8k tokens on an 8-16 GB card, up to 32k on an 80 GB one.
        gpu_gib = (hw.cuda_memory[0] if hw.cuda_memory else 0) / 2**30
        microbatch = config.train.microbatch_tokens or (4096 if gpu_gib < 8 else 8192 if gpu_gib < 16
                                                        else 16384 if gpu_gib < 40 else 32768)
    if ceiling is not None and not hw.cuda_devices:
        microbatch = fit_microbatch(microbatch, ceiling * 1e9, model_scale)
    return Resolved(
        threads=threads,
        questions=questions,
        completions=completions,
        max_new_tokens=config.round.max_new_tokens or preset.max_new_tokens,
        # SAPO's I local + J external: by default the questions a round generates split between the
        # two (8 questions -> 4 local + 4 external, the paper's best mix).
        local_groups=(
            max(1, questions - config.round.external_groups)
            if config.round.local_groups is None
            else config.round.local_groups
        ),
        microbatch_tokens=microbatch,
    )


def memory_note(config: Config, resolved: Resolved, model_scale: float = 1.0) -> str | None:
    """What a memory ceiling made of the training microbatch, for the user (None: no ceiling set)."""
    if config.resources.max_memory_gb is None or config.train.microbatch_tokens is not None:
        return None
    mb = resolved.microbatch_tokens
    return (f"memory ceiling {config.resources.max_memory_gb:g} GB: training microbatch {mb} tokens "
            f"(estimated peak {estimate_peak_bytes(mb, model_scale) / 1e9:.1f} GB)")

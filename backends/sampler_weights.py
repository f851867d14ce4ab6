"""The CPU sampler's weights: the shipped GGUF as it is, or an F16 copy of it made once.

Why a copy: llama.cpp multiplies Q4_1 blocks (the shipped SmolLM2 file) on its generic path, which
quantizes the activations to 8 bits and gains little from a batch (a prompt's tokens and a decode
step's live replies cost about 7 ms each on the machine below); F16 weights take its blocked matrix
kernels (llamafile's sgemm) instead. Measured on a 2-core Xeon with
AVX-512 and AMX (assets/results/sampler-weights-amx/): the same prompts and reply lengths decode in
0.62x the time (raw llama.cpp, F16 against Q4_1), prompt processing 2.1x as fast, and the
sampler's log-probabilities sit 0.002 nats a token from the fp32 trainer's instead of 0.054 (the
trainer is converted from the same file: F16 holds every Q4_1 value to 11 bits, so the sampler and
the trainer then run one policy and the importance weight has little left to correct). What it
costs: the file is 2.8x the size (271 MB against 98 MB on disk, mapped) and is written once, in
seconds; a one-reply decode step reads all of it, so the copy wins on batches, not on a lone reply.
Files already in F16, BF16 or F32 are used as they are. Q8_0 was tried too: as fast, but its
sampler was further from the trainer (0.073 nats) than the shipped file's. Which CPUs and files
get the copy is decided in app/sizing.sampler_weights_choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc

from .atomic import atomic_file, made_once, remove_stale_temporaries
from .base import BackendUnavailable
from .hf_from_gguf import gguf_fingerprint
from .llama_cpp_engine import gguf_metadata, silence_llama_logs
from .settings import CpuSamplerChoice

log = logging.getLogger(__name__)

# GGUF `general.file_type` values whose matrices are already floating point (llama.cpp's
# LLAMA_FTYPE_ALL_F32, _MOSTLY_F16 and _MOSTLY_BF16), and Q4_1's (_MOSTLY_Q4_1), the one measured.
FLOAT_FILE_TYPES = {0, 1, 32}
Q4_1_FILE_TYPE = 3


def file_type(gguf: Path) -> int | None:
    """The GGUF's `general.file_type` (llama.cpp's LLAMA_FTYPE_*), None where it does not say."""
    value = gguf_metadata(gguf, "general.file_type").get("general.file_type")
    return None if value is None else int(value)


class SamplerWeightsError(BackendUnavailable):
    pass


@dataclass(frozen=True)
class SamplerWeights:
    path: Path  # the GGUF the sampler loads
    note: str  # what was done, for the node's backend line


def sampler_weights(gguf: Path, cache_dir: Path, threads: int, choice: CpuSamplerChoice) -> SamplerWeights:
    """The file the CPU sampler runs, as app/sizing.sampler_weights_choice decided. A copy that
    cannot be written is an error where it was asked for (backend.sampler_weights = "f16") and a
    warning under "auto", which then samples the file as shipped: the copy only makes sampling
    faster."""
    if not choice.f16:
        return SamplerWeights(gguf, f"as shipped: {choice.reason}")
    kind = file_type(gguf)
    if kind in FLOAT_FILE_TYPES:
        return SamplerWeights(gguf, "as shipped: its matrices are floating point already")
    if kind != Q4_1_FILE_TYPE and not choice.f16_any:
        return SamplerWeights(gguf, "as shipped: only Q4_1 files are copied to F16 by default (measured)")
    try:
        return SamplerWeights(f16_copy(gguf, cache_dir, threads), f"an F16 copy: {choice.reason}")
    except SamplerWeightsError as exc:
        if choice.f16_any:  # asked for by name
            raise
        log.warning("sampling from %s as shipped: %s", gguf.name, exc)
        return SamplerWeights(gguf, f"as shipped: the F16 copy failed ({exc})")


def f16_copy(gguf: Path, cache_dir: Path, threads: int = 1) -> Path:
    """An F16 copy of `gguf` under `cache_dir`, written once: atomically (a temporary file renamed
    into place) and by one process at a time (`made_once`)."""
    target = cache_dir / "sampler-models" / f"{gguf.stem}-{gguf_fingerprint(gguf)}.F16.gguf"

    def write() -> None:
        remove_stale_temporaries(target)  # a killed writer's (none runs now: made_once's lock)
        with atomic_file(target, fsync=False) as partial:
            _quantize_to_f16(gguf, partial, threads)

    try:
        made_once(target, target.is_file, write)
    except OSError as exc:  # a full disk, a read-only cache
        raise SamplerWeightsError(f"cannot write an F16 copy of {gguf.name} in {target.parent} ({exc}); "
                                  "set backend.sampler_weights = 'shipped' to sample from the file itself") from None
    return target


def _quantize_to_f16(gguf: Path, out: Path, threads: int) -> None:
    silence_llama_logs()  # the conversion prints the model's metadata to stderr otherwise
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = threads
    status = lc.llama_model_quantize(str(gguf).encode(), str(out).encode(), params)
    if status != 0 or not out.is_file():
        raise SamplerWeightsError(f"llama.cpp could not write an F16 copy of {gguf.name} (status {status}: a full "
                                  "disk is one cause); set backend.sampler_weights = 'shipped' to sample from the "
                                  "file itself")

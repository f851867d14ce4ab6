"""The CPU sampler's weights: the shipped GGUF as it is, or an F16 copy of it made once.

Why a copy: llama.cpp multiplies Q4_1 blocks (the shipped SmolLM2 file) on its generic path, which
quantizes the activations to 8 bits and gains little from a batch (a prompt's tokens and a decode
step's live replies cost about 7 ms each on the machine below); F16 weights take its tiled matrix
kernels instead. Measured on a 2-core Xeon with
AVX-512 and AMX (assets/results/sampler-weights-amx/): the same prompts and reply lengths decode in
0.62x the time (raw llama.cpp, F16 against Q4_1), prompt processing 2.1x as fast, and the
sampler's log-probabilities sit 0.002 nats a token from the fp32 trainer's instead of 0.054 (the
trainer is converted from the same file: F16 holds every Q4_1 value to 11 bits, so the sampler and
the trainer then run one policy and the importance weight has little left to correct). What it
costs: the file is 2.8x the size (257 MB against 92 MB, mapped) and is written once, in seconds.
Files already in F16, BF16 or F32 are used as they are. Q8_0 was tried too: as fast, but its
sampler was further from the trainer (0.073 nats) than the shipped file's. Which CPUs and files
get the copy is decided in app/sizing.sampler_weights_choice.
"""

from __future__ import annotations

import os
from pathlib import Path

from .hf_from_gguf import gguf_fingerprint

# GGUF `general.file_type` values whose matrices are already floating point (llama.cpp's
# LLAMA_FTYPE_ALL_F32, _MOSTLY_F16 and _MOSTLY_BF16), and Q4_1's (_MOSTLY_Q4_1), the one measured.
FLOAT_FILE_TYPES = {0, 1, 32}
Q4_1_FILE_TYPE = 3


def file_type(gguf: Path) -> int | None:
    """The GGUF's `general.file_type` (llama.cpp's LLAMA_FTYPE_*), None where it does not say."""
    from .gguf_lora import gguf_metadata

    value = gguf_metadata(gguf, "general.file_type").get("general.file_type")
    return None if value is None else int(value)


class SamplerWeightsError(RuntimeError):
    pass


def f16_copy(gguf: Path, cache_dir: Path, threads: int = 1, any_quantized: bool = False) -> Path:
    """An F16 copy of `gguf` under `cache_dir`, written once (atomically: a temporary file renamed
    into place), where `gguf` is Q4_1 (or, with `any_quantized`, any file whose matrices are not
    floating point already); otherwise `gguf` itself."""
    kind = file_type(gguf)
    if kind in FLOAT_FILE_TYPES or (kind != Q4_1_FILE_TYPE and not any_quantized):
        return gguf
    target = cache_dir / "sampler-models" / f"{gguf.stem}-{gguf_fingerprint(gguf)}.F16.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    import llama_cpp as lc

    from .llama_cpp_engine import silence_llama_logs

    silence_llama_logs()  # the conversion prints the model's metadata to stderr otherwise
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = threads
    try:
        status = lc.llama_model_quantize(str(gguf).encode(), str(partial).encode(), params)
        if status != 0 or not partial.is_file():
            raise SamplerWeightsError(f"llama.cpp could not write an F16 copy of {gguf.name} (status {status}); "
                                      "set backend.sampler_weights = 'shipped' to sample from the file itself")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target

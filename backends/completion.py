"""What every generator does the same around its own decoding loop: refuse a temperature that
has no sampling distribution, and hand the completions back as one `GenerationResult`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .base import Completion, GenerationResult, SamplingParams


def check_sampling(params: SamplingParams) -> None:
    if params.temperature <= 0:
        raise ValueError("temperature must be > 0 (RL needs the sampling distribution's logprobs)")


def generation_result(
    prompt_ids: Sequence[Sequence[int]], n: int, completions: Sequence[Completion], started: float
) -> GenerationResult:
    """`completions` in prompt order, `n` per prompt; `started` is the `time.perf_counter()` at
    which the call began."""
    return GenerationResult(
        prompt_ids=[list(p) for p in prompt_ids],
        completions=[list(completions[p * n : (p + 1) * n]) for p in range(len(prompt_ids))],
        seconds=time.perf_counter() - started,
        prefill_tokens=sum(len(p) for p in prompt_ids),
        generated_tokens=sum(len(c.token_ids) for c in completions),
    )

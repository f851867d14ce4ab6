"""Before a CPU node trains with a bf16 base (train.cpu_bf16 = "auto" on a CPU with AVX-512 BF16 or
AMX), it checks that the bf16 path agrees with fp32 on a fixed batch: a few short task prompts
and replies, the trainer's per-token log-probabilities both ways.

Tolerance: bf16's 8 significant bits move a token's logprob by a few hundredths, and by how much
depends on the CPU's kernels and the thread count (the shipped model's fixed batch, the same sound
path: mean 0.024 nats on an AMX Xeon, 0.031 at 2 threads and 0.051 at 1 thread on an EPYC with
AVX-512 BF16 but no AMX, 0.038 on an AVX2-only EPYC where torch emulates bf16). A faulty path is
far off: one layer's weights doubled by the cast moves the mean by 0.35 nats (max 1.37). The limit
sits between the two with room on both sides: `MEAN_NATS` 0.1, twice the worst sound path seen
and a third of that fault, so that a sound path never flips between bf16 and fp32 from one start
to the next (0.05, the limit before, refused the sound path at one thread on the AVX-512 EPYC). The
node's sampler disagrees with its fp32 trainer by 0.045-0.075 nats a token already (llama.cpp on
the Q4_1 file), which the truncated importance weight absorbs: 0.1 is of that order, not a
different policy. Any token moved by more than `MAX_NATS` (a probability ratio of e) is refused
whatever the mean. A difference of exactly zero is refused too: then bf16 did not run at all.

It runs on a start's adapter, which is zero, so it cannot see what becomes of the adapter's
updates: eager bf16 rounds them away (tests/test_trainer_is_the_sampler.py), which is why bf16
goes with the compiled trainer only (app/sizing.cpu_bf16_choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .base import ChatPrompt, TrainSample

MEAN_NATS = 0.1
MAX_NATS = 1.0

# The fixed batch: short task prompts as the node renders them, with replies of the kinds it
# writes (right, wrong, unfinished).
CHECK_PROMPTS = (
    (ChatPrompt("Reply with only the final answer inside <answer></answer> tags.", "What is 17 + 25?", "<answer>"),
     ("42</answer>", "41</answer>", "4")),
    (ChatPrompt("Reply with only the final answer inside <answer></answer> tags.",
                "How many legs do 2 cats and 1 spider have?", "<answer>"), ("16</answer>", "eleven</answer>")),
)


@dataclass(frozen=True)
class Bf16Check:
    agrees: bool
    mean_nats: float  # mean |log pi_bf16 - log pi_fp32| per token
    max_nats: float

    def describe(self) -> str:
        return f"bf16 vs fp32 on a fixed batch: mean {self.mean_nats:.3f}, max {self.max_nats:.3f} nats per token"


def check_samples(encode_prompt: Callable[[ChatPrompt], list[int]], tokenize: Callable[[str], list[int]]) -> list[TrainSample]:
    return [TrainSample(encode_prompt(prompt), tokenize(reply), advantage=0.0)
            for prompt, replies in CHECK_PROMPTS for reply in replies]


def check_bf16(trainer, samples: list[TrainSample]) -> Bf16Check:
    """Turns the trainer's bf16 base on and compares; leaves it on only when it agrees. Both passes
    run eagerly: a start builds no compiled graphs for passes no round makes (on the zero adapter
    the check sees, compiled and eager bf16 differ by rounding: ~0.04 nats a token)."""
    compiled, trainer.compiling.on = trainer.compiling.on, False
    try:
        fp32 = trainer.token_logprobs(samples)
        trainer.bf16_base = True
        bf16 = trainer.token_logprobs(samples)
    finally:
        trainer.compiling.on = compiled
    diffs = np.abs(np.concatenate([np.subtract(a, b) for a, b in zip(fp32, bf16)]))
    mean, worst = float(diffs.mean()), float(diffs.max())
    result = Bf16Check(0.0 < mean <= MEAN_NATS and worst <= MAX_NATS, mean, worst)
    if not result.agrees:
        trainer.bf16_base = False
    return result

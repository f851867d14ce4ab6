"""The held-out score: did the model get better at the preset's tasks?

Each preset has a fixed evaluation set: tasks from seeds at or above `tasks.EVAL_SEED`, which no
training round draws and which the swarm's intake refuses, across the preset's datasets at their
first (easiest) levels, about 96 items. Every reply is decoded near-greedily (a very low
temperature with a fixed seed, since the samplers need a distribution to draw from) and scored
right or wrong, so two evaluations of the same weights agree, and the training reward's moving
curriculum and format bonus never enter it.

Held out means no training round draws these items; it cannot mean that no training question
reads the same: the easiest levels have few distinct questions (2 one-digit terms: 100 sums), so
some evaluation questions also come up in training. Held-out accuracy therefore measures the
skill on the preset's easy levels, not recall of items; the harder the level, the fewer repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from statistics import fmean

from ...backends.base import Abandoned, Sampler, SamplingParams
from .prompt import STOP, PromptFormat
from .reward import CLOSE
from .tasks import EVAL_SEED, Preset, Task, load_preset, regenerate

EVAL_ITEMS = 96  # spread evenly over the preset's datasets
EVAL_LEVELS = 2  # each dataset's first levels: where a small model can show progress
EVAL_TEMPERATURE = 0.01
EVAL_SAMPLING_SEED = 20_250_913


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    per_dataset: dict[str, float]
    # Share of replies with a closed tag: early gains are partly the format (a reply without it
    # is wrong), so the accuracy is read beside it.
    tag_rate: float
    items: int
    seconds: float


def eval_fields(result: EvalResult, weights_round: int) -> dict:
    """The round record's held-out fields for a result measured on the weights of `weights_round`."""
    return {"eval_accuracy": result.accuracy, "eval_per_dataset": result.per_dataset, "eval_tag_rate": result.tag_rate,
            "eval_of_round": weights_round, "eval_seconds": result.seconds}


@lru_cache(maxsize=8)
def eval_tasks(preset_name: str) -> tuple[Task, ...]:
    """The preset's evaluation set, the same on every machine."""
    preset = load_preset(preset_name)
    per_dataset = max(1, EVAL_ITEMS // len(preset.datasets))
    tasks = []
    for d, dataset in enumerate(preset.datasets):
        levels = min(EVAL_LEVELS, len(preset.levels[dataset]))
        for i in range(per_dataset):
            tasks.append(regenerate(preset.spec(dataset, i % levels, EVAL_SEED + d, i)))
    return tuple(tasks)


def evaluate(
    sampler: Sampler,
    preset: Preset,
    prefill_answer: bool,
    max_new_tokens: int,
    should_stop: Callable[[], bool] | None = None,
) -> EvalResult:
    """Accuracy on the preset's evaluation set; raises Abandoned when `should_stop` turns true."""
    started = time.perf_counter()
    tasks = eval_tasks(preset.name)
    form = PromptFormat(prefill_answer)
    prompts = [form.prompt(t.question) for t in tasks]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=EVAL_TEMPERATURE, stop=STOP,
                            seed=EVAL_SAMPLING_SEED)
    generated = sampler.generate(prompts, 1, params, should_stop)
    replies = [group[0] for group in generated.completions]
    if any(c.finish_reason == "abandoned" for c in replies):
        raise Abandoned("evaluation abandoned")
    right: dict[str, list[float]] = {}
    tagged = 0
    for task, reply in zip(tasks, replies):
        scored = form.score(task, reply.text, 0.0)
        right.setdefault(task.spec.dataset, []).append(scored.strict)
        tagged += CLOSE in reply.text
    return EvalResult(
        accuracy=fmean(s for scores in right.values() for s in scores),
        per_dataset={d: fmean(scores) for d, scores in sorted(right.items())},
        tag_rate=tagged / len(tasks),
        items=len(tasks),
        seconds=round(time.perf_counter() - started, 3),
    )

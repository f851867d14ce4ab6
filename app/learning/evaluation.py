"""The held-out score: did the model get better at the preset's tasks?

Two sets, both from seeds at or above `tasks.EVAL_SEED`, which no training round draws and which
the swarm's intake refuses:
- **the fixed set**: `EVAL_ITEMS` (240) items spread evenly over the preset's datasets at their
  first two levels, the same on every machine and at every evaluation: the curve a node is
  compared on, over time and with other nodes (at 25% accuracy its standard error is 2.8 points;
  96 items gave 4.4);
- **the at-level set**: `AT_LEVEL_ITEMS` items per dataset at the level the node trains that
  dataset on now, which shows what the training reward cannot (it moves with the curriculum): how
  well the node does where it is working. Its items change when a level does.
Every reply is decoded near-greedily (a very low temperature with a fixed seed, since the samplers
need a distribution to draw from) and scored right or wrong, so two evaluations of the same weights
agree, and the training reward's format bonus never enters it.

`pass_at_k` samples K replies per fixed item at the training temperature: the base model's pass@K
is the ceiling RL on this model can be expected to approach (Yue et al., arXiv 2504.13837: RL
mostly sharpens what the base model can already do).

Held out means never trained on: every question of these sets (and of an experiment's) is
reserved by its text, so no round draws it, whatever the seed, and no peer's group on it is
trained on (learning/reserved.py). The easiest levels hold few distinct questions (2 one-digit
terms: 100 sums), so there the reserved share is large and training sees fewer kinds of question.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import fmean

from ...backends.base import Abandoned, Completion, Sampler, SamplingParams
from .prompt import STOP, PromptFormat
from .reward import CLOSE, RIGHT, strict_score
from .round_record import EvalFields
from .tasks import EVAL_SEED, Preset, Task, load_preset, regenerate

EVAL_ITEMS = 240  # the fixed set, spread evenly over the preset's datasets
EVAL_LEVELS = 2  # its levels: each dataset's first two, where a small model can show progress
AT_LEVEL_ITEMS = 16  # per dataset, at the node's current level
AT_LEVEL_SEED = EVAL_SEED + 1000  # its seeds: apart from the fixed set's (EVAL_SEED + dataset index)
EVAL_TEMPERATURE = 0.01
EVAL_SAMPLING_SEED = 20_250_913
# Prompts per generation call: llama.cpp keeps a KV cache cell per prompt and reply token, so a
# batch of 96 short prompts stays near the ~0.3 GB a round's generation uses.
EVAL_BATCH = 96


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    per_dataset: dict[str, float]
    # Share of replies with a closed tag: early gains are partly the format (a reply without it
    # is wrong), so the accuracy is read beside it.
    tag_rate: float
    items: int
    seconds: float
    # The same at the levels the node trains on (None: not measured), and those levels.
    at_level: EvalResult | None = None
    levels: dict[str, int] | None = None

    @property
    def standard_error(self) -> float:
        """The binomial standard error of `accuracy` over its items."""
        return math.sqrt(self.accuracy * (1 - self.accuracy) / self.items) if self.items else 0.0


def eval_fields(result: EvalResult, weights_round: int) -> EvalFields:
    """The round record's held-out fields for a result measured on the weights of `weights_round`."""
    fields = EvalFields(eval_accuracy=result.accuracy, eval_per_dataset=result.per_dataset,
                        eval_tag_rate=result.tag_rate, eval_of_round=weights_round, eval_seconds=result.seconds,
                        eval_items=result.items)
    if result.at_level is not None:
        fields.update(eval_at_level_accuracy=result.at_level.accuracy,
                      eval_at_level_per_dataset=result.at_level.per_dataset, eval_levels=result.levels)
    return fields


def fixed_set_levels(preset_name: str) -> dict[str, tuple[int, ...]]:
    """The levels each dataset's fixed-set items come from."""
    preset = load_preset(preset_name)
    return {d: tuple(range(min(EVAL_LEVELS, len(levels)))) for d, levels in preset.levels.items()}


@lru_cache(maxsize=8)
def eval_tasks(preset_name: str) -> tuple[Task, ...]:
    """The preset's fixed evaluation set, the same on every machine."""
    preset = load_preset(preset_name)
    per_dataset = max(1, EVAL_ITEMS // len(preset.datasets))
    tasks = []
    for d, dataset in enumerate(preset.datasets):
        levels = len(fixed_set_levels(preset_name)[dataset])
        for i in range(per_dataset):
            tasks.append(regenerate(preset.spec(dataset, i % levels, EVAL_SEED + d, i)))
    return tuple(tasks)


@lru_cache(maxsize=256)
def at_level_tasks(preset_name: str, dataset: str, level: int, items: int = AT_LEVEL_ITEMS) -> tuple[Task, ...]:
    """`items` held-out items of one dataset at one level (the first ones are the same for any count)."""
    preset = load_preset(preset_name)
    d = preset.datasets.index(dataset)
    return tuple(regenerate(preset.spec(dataset, level, AT_LEVEL_SEED + d, i)) for i in range(items))


def score_tasks(sampler: Sampler, tasks: Sequence[Task], prefill_answer: bool, max_new_tokens: int,
                should_stop: Callable[[], bool] | None = None) -> EvalResult:
    """Near-greedy accuracy on any held-out tasks (an experiment's own set)."""
    started = time.perf_counter()
    form = PromptFormat(prefill_answer)
    replies = [group[0] for group in _generate(sampler, form, tasks, 1, near_greedy(max_new_tokens), should_stop)]
    return _score(form, tasks, replies, round(time.perf_counter() - started, 3))


@dataclass(frozen=True)
class FixedAnswer:
    """The most common answer, given to every item, and its accuracy: what a shortcut scores
    without solving anything (letter_counting at level 0: "1" is right on 26 of 40 held-out items,
    and a node trained on it learns to say "1")."""

    answer: str
    accuracy: float


def fixed_answer_score(tasks: Sequence[Task]) -> FixedAnswer:
    """The most common right answer of `tasks`, scored by the verifier on all of them."""
    answer = Counter(str(t.entry.get("answer")) for t in tasks).most_common(1)[0][0]
    return FixedAnswer(answer, fmean(strict_score(t, answer) for t in tasks))


SPACE_DRAWS = 3000  # draws that size a level's question space (a level with >= 1,000 distinct is large)


@lru_cache(maxsize=64)
def question_space(preset_name: str, dataset: str, level: int, draws: int = SPACE_DRAWS) -> int:
    """Distinct questions among `draws` training draws of a level: how much of the level a node can
    see, and how large a share of it the held-out sets take (learning/reserved.py)."""
    import numpy as np

    preset, rng = load_preset(preset_name), np.random.default_rng(draws)
    return len({regenerate(preset.training_spec(dataset, level, rng)).question for _ in range(draws)})


def fixed_set_shortcuts(preset_name: str) -> dict[str, FixedAnswer]:
    """Per dataset, what one fixed answer given to all of its fixed-set items scores."""
    by_dataset: dict[str, list[Task]] = {}
    for task in eval_tasks(preset_name):
        by_dataset.setdefault(task.spec.dataset, []).append(task)
    return {d: fixed_answer_score(tasks) for d, tasks in by_dataset.items()}


def near_greedy(max_new_tokens: int) -> SamplingParams:
    """The evaluation's decoding (also `ask`'s and an export's suggested settings)."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=EVAL_TEMPERATURE, stop=STOP, seed=EVAL_SAMPLING_SEED)


def evaluate(
    sampler: Sampler,
    preset: Preset,
    prefill_answer: bool,
    max_new_tokens: int,
    should_stop: Callable[[], bool] | None = None,
    levels: Mapping[str, int] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Accuracy on the preset's fixed set, and with `levels` on the at-level set too; raises
    Abandoned when `should_stop` turns true. `on_progress(items replied, items)` as replies end."""
    started = time.perf_counter()
    fixed = eval_tasks(preset.name)
    at_level = [t for d, level in (levels or {}).items() for t in at_level_tasks(preset.name, d, level)]
    form = PromptFormat(prefill_answer)
    replies = [group[0] for group in _generate(sampler, form, [*fixed, *at_level], 1, near_greedy(max_new_tokens),
                                               should_stop, on_progress)]
    seconds = round(time.perf_counter() - started, 3)
    result = _score(form, fixed, replies[: len(fixed)], seconds)
    if levels:
        extra = _score(form, at_level, replies[len(fixed):], seconds)
        result = EvalResult(result.accuracy, result.per_dataset, result.tag_rate, result.items, seconds,
                            at_level=extra, levels=dict(levels))
    return result


@dataclass(frozen=True)
class PassAtK:
    k: int
    pass_at_1: float  # the mean share of right replies per item
    pass_at_k: float  # the share of items with at least one right reply among k
    per_dataset: dict[str, float]  # pass@k
    items: int
    seconds: float


def pass_at_k(sampler: Sampler, preset: Preset, prefill_answer: bool, max_new_tokens: int, k: int,
              temperature: float, seed: int = EVAL_SAMPLING_SEED, tasks: Sequence[Task] | None = None) -> PassAtK:
    """K replies per item at `temperature` (the training one): pass@1 and pass@K, on the fixed
    set or on `tasks` (an experiment's held-out items)."""
    started = time.perf_counter()
    tasks = eval_tasks(preset.name) if tasks is None else tasks
    form = PromptFormat(prefill_answer)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, stop=STOP, seed=seed)
    groups = _generate(sampler, form, tasks, k, params, None)
    right_share, any_right = [], {}
    for task, replies in zip(tasks, groups):
        right = [form.score(task, r.text, 0.0).strict >= RIGHT for r in replies]
        right_share.append(fmean(right))
        any_right.setdefault(task.spec.dataset, []).append(float(any(right)))
    return PassAtK(k, fmean(right_share), fmean(v for vs in any_right.values() for v in vs),
                   {d: fmean(v) for d, v in sorted(any_right.items())}, len(tasks),
                   round(time.perf_counter() - started, 3))


def _generate(sampler: Sampler, form: PromptFormat, tasks: Sequence[Task], n: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None,
              on_progress: Callable[[int, int], None] | None = None) -> list[list[Completion]]:
    """`n` replies per task, generated EVAL_BATCH // n prompts at a time (the same batches, with
    the same seed, every time: two evaluations of the same weights agree)."""
    out: list[list[Completion]] = []
    per_call = max(1, EVAL_BATCH // n)
    total = len(tasks) * n
    for start in range(0, len(tasks), per_call):
        prompts = [form.prompt(t.question) for t in tasks[start: start + per_call]]
        report = None
        if on_progress is not None:
            def report(done: int, _total: int, _tokens: int, before: int = start * n) -> None:
                on_progress(before + done, total)
        generated = sampler.generate(prompts, n, params, should_stop, report).completions
        if any(c.finish_reason == "abandoned" for group in generated for c in group):
            raise Abandoned("evaluation abandoned")
        out.extend(generated)
    return out


def _score(form: PromptFormat, tasks: Sequence[Task], replies: Sequence[Completion], seconds: float) -> EvalResult:
    right: dict[str, list[float]] = {}
    tagged = 0
    for task, reply in zip(tasks, replies):
        right.setdefault(task.spec.dataset, []).append(form.score(task, reply.text, 0.0).strict)
        tagged += CLOSE in reply.text
    return EvalResult(
        # the headline: the mean over datasets (each dataset counts the same, whatever its items)
        accuracy=fmean(fmean(scores) for scores in right.values()),
        per_dataset={d: fmean(scores) for d, scores in sorted(right.items())},
        tag_rate=tagged / len(tasks),
        items=len(tasks),
        seconds=seconds,
    )

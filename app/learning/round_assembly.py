"""Step 8 of the round (learning/round.py): the record, assembled from the steps' values, and the
round's outcome the caller commits with its checkpoint. Pure but for the clock and the process's
memory: everything it reports was decided in the steps before it."""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import TYPE_CHECKING

import psutil

from .curriculum import ALL_RIGHT, ALL_WRONG, MIXED, Curriculum, group_outcome
from .evaluation import EvalResult, eval_fields
from .rollout import QuestionGroup, ScoredCompletion
from .round_record import RoundRecord, SwarmRoundStats, TrainRecord
from .tasks import Preset

if TYPE_CHECKING:  # the steps' values; round.py imports this module
    from .round import Batch, RoundSettings, Scored, Stopwatch, Update


@dataclass
class RoundOutcome:
    record: RoundRecord
    groups: list[QuestionGroup]
    curriculum: Curriculum  # the updated copy, to be committed with the checkpoint
    used_external: list[QuestionGroup] = field(default_factory=list)  # to leave the pool for good
    trained: list[QuestionGroup] = field(default_factory=list)  # every group the update used
    waiting: list[QuestionGroup] = field(default_factory=list)  # selected, waiting for the next step
    awaiting_rescue: list[QuestionGroup] = field(default_factory=list)  # own all-wrong groups (rescue.py)


@dataclass(frozen=True)
class RoundClosing:
    """What the caller adds to the round's record once its update is applied: the swarm's figures
    and the held-out score, when one was measured (the result and the round whose weights it scored)."""

    external_rejected: int = 0
    swarm: SwarmRoundStats | None = None
    held_out: tuple[EvalResult, int] | None = None
    best: tuple[float, int] | None = None  # the best held-out accuracy so far, and its round



def assemble(round_no: int, started: float, watch: Stopwatch, curriculum: Curriculum, settings: RoundSettings,
             preset: Preset, backend_name: str, scored: Scored, batch: Batch, update: Update,
             closing: RoundClosing) -> RoundOutcome:
    """The round's outcome from its steps' values (pure but for the clock and the process's memory):
    the record, and the curriculum's progress on a copy, which the caller keeps only with the checkpoint."""
    groups, generated, train_stats, trained = scored.groups, scored.generated, update.stats, update.trained
    updated = copy.deepcopy(curriculum)
    for g in groups:
        updated.record(g.task.spec.dataset, g.level, [c.strict for c in g.completions])
    completions = [c for g in groups for c in g.completions]
    trained_external = [g for g in trained if g.source != "local"]
    tag_rate = fmean(c.well_formed for c in completions)
    updated.record_tag_rate(tag_rate)
    selection, screening, rescued, offered = batch.selection, batch.screening, batch.rescued, batch.offered

    per_dataset: dict[str, list[float]] = {}
    for g in groups:
        per_dataset.setdefault(g.task.spec.dataset, []).append(g.strict_mean)
    record = RoundRecord(
        round=round_no,
        reward_mean=fmean(c.strict for c in completions),
        shaped_reward_mean=fmean(c.reward for c in completions),
        format_bonus=scored.format_bonus,
        tag_rate=tag_rate,
        questions=len(groups),
        completions=len(completions),
        solved=sum(g.solved for g in groups),
        signal_share=fmean(g.has_signal for g in groups),
        local_groups=len(selection.local),
        external_groups=len(selection.external),
        external_available=len(offered),
        # Peers' groups as this node's own verifier scored them: the swarm-wide comparison the
        # viewers show, without trusting anything a peer claims about itself.
        external_reward_mean=fmean(c.strict for g in offered for c in g.completions) if offered else None,
        trained_samples=len(batch.samples) if train_stats else 0,
        generated_tokens=generated.generated_tokens,
        prefill_tokens=generated.prefill_tokens,
        tokens_per_s=generated.tokens_per_s,
        seconds={k: round(v, 3) for k, v in watch.seconds.items()} | {"hand-off": round(update.handoff_seconds, 3)},
        per_dataset={k: fmean(v) for k, v in sorted(per_dataset.items())},
        levels=updated.levels(),
        format_only_share=fmean(g.format_only for g in trained) if train_stats else None,
        external_advantage_share=_advantage_share(trained_external, trained) if train_stats else None,
        external_age_rounds_mean=fmean(round_no - (g.received_round or round_no) for g in trained_external)
        if trained_external else None,
        external_groups_by_peer=dict(Counter(g.source for g in trained_external)),
        token_entropy=_token_entropy(completions),
        distinct_answers=fmean(scored.distinct_answers),
        group_outcomes=_outcome_shares(groups),
        signal_groups=batch.signal_groups,
        learnable_groups=sum(g.strict_signal for g in batch.own if g.sampled_round in (None, round_no)),  # this round's
        min_signal_groups=settings.min_signal_groups,
        waiting_groups=len(update.waiting),
        train=None if train_stats is None else TrainRecord(
            loss=train_stats.loss,
            tokens=train_stats.tokens,
            grad_norm=train_stats.grad_norm,
            clip_fraction=train_stats.clip_fraction,
            ratio_mean=train_stats.ratio_mean,
            sampler_logprob_gap=train_stats.sampler_logprob_gap,
            sampler_ratio_outside=train_stats.sampler_ratio_outside,
            groups=len(trained),
            kl=train_stats.kl,
            learning_rate=train_stats.learning_rate,
            reference_seconds=round(train_stats.reference_seconds, 3),
            external_negative_weight=train_stats.external_negative_weight,
        ),
        **(eval_fields(*closing.held_out) if closing.held_out is not None else {}),
        eval_best_accuracy=closing.best[0] if closing.best else None,
        eval_best_of_round=closing.best[1] if closing.best else None,
        external_rejected=closing.external_rejected,
        external_screened=len(screening.dropped) if screening else 0,
        external_held_out=len(batch.held_out),
        external_other_preset=len(batch.other_preset),
        external_text_surprise=screening.highest if screening else None,
        timestamp=started,
        wall_seconds=round(time.time() - started, 3),
        model=settings.model,
        preset=preset.name,
        backend=backend_name,
        rss_bytes=psutil.Process().memory_info().rss,
        swarm=closing.swarm,
        rescued_groups=len(rescued.rescued) if rescued else 0,
        rescued_replies_by_peer=dict(rescued.by_peer) if rescued else {},
        awaiting_rescue=len(rescued.still_waiting) if rescued else 0,
    )
    return RoundOutcome(record, groups, updated, batch.used_external, trained, update.waiting,
                        rescued.still_waiting if rescued else [])


def _token_entropy(completions: Sequence[ScoredCompletion]) -> float | None:
    """The sampling policy's entropy per token, estimated by the mean surprisal (-log pi) of the
    tokens it sampled (an unbiased estimate: E[-log pi(x)] over x ~ pi is the entropy)."""
    logprobs = [lp for c in completions if c.sampler_logprobs for lp in c.sampler_logprobs]
    return -fmean(logprobs) if logprobs else None


def _outcome_shares(groups: Sequence[QuestionGroup]) -> dict[str, dict[str, float]]:
    """Per dataset, the shares of the round's groups that were all right, all wrong and mixed."""
    by_dataset: dict[str, list[str]] = {}
    for g in groups:
        by_dataset.setdefault(g.task.spec.dataset, []).append(group_outcome([c.strict for c in g.completions]))
    return {d: {o: outcomes.count(o) / len(outcomes) for o in (ALL_RIGHT, ALL_WRONG, MIXED)}
            for d, outcomes in sorted(by_dataset.items())}


def _advantage_share(part: Sequence[QuestionGroup], whole: Sequence[QuestionGroup]) -> float:
    """`part`'s share of the advantage mass (sum of |advantage| over replies) of `whole`."""
    mass = sum(abs(a) for g in whole for a in g.advantages())
    return sum(abs(a) for g in part for a in g.advantages()) / mass if mass else 0.0

"""When the node measures its held-out score (learning/evaluation.py): the weights it starts
from (a fresh node's base model after its first update, where the sampler can switch the adapter
off), then every `eval.every_rounds` rounds; each result goes into the record of the round that
measured it, with the round whose weights it scored."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path

from ...backends.base import Abandoned, Sampler, StopCheck
from ..events import Listener, Notice, Preparing
from ..learning.evaluation import EvalResult, evaluate
from ..learning.tasks import Preset
from ..metrics import read_records

# Scores the current weights (after the given round); raises Abandoned when told to stop.
Measure = Callable[[int, StopCheck | None], EvalResult]
HeldOutScore = tuple[EvalResult, int]  # the result and the round whose weights it scored
BASE_WAITS_ROUNDS = 10  # a fresh node that has not trained by then scores the base model anyway


class HeldOutSchedule:
    def __init__(self, every_rounds: int, measure: Measure, base_scores: dict | None = None) -> None:
        self.every_rounds = every_rounds
        self._measure = measure
        # Nodes that start from the same base model (an experiment's) share its deterministic score.
        self._base_scores = base_scores
        self._pending: HeldOutScore | None = None  # the start's score, for the first round's record
        self._start_done = False
        self._base_due: tuple[Measure, Hashable] | None = None  # the base model's score, deferred

    @property
    def _shared(self) -> dict:
        """The base scores this node shares (an experiment's nodes), or a dict of its own."""
        if self._base_scores is None:
            self._base_scores = {}
        return self._base_scores

    def _base_score(self, measure: Measure, key: Hashable, should_stop: StopCheck | None) -> EvalResult:
        """The base model's score: a sharing node's, or measured (once for all that share it)."""
        if key not in self._shared:
            self._shared[key] = measure(0, should_stop)
        return self._shared[key]

    def resumed_at(self, round_no: int, saved_record: dict | None) -> None:
        """The weights we resume from were measured when their round ended: no need to again."""
        self._start_done = round_no > 0 and (saved_record or {}).get("eval_of_round") == round_no

    def at_start(self, round_no: int, key: Hashable, should_stop: StopCheck, measure_base: Measure | None = None,
                 base_missing: bool = False) -> None:
        """The score of the weights the node starts from (the base model on a fresh start).
        `measure_base`, where the sampler can switch its adapter off: a fresh node scores the
        base model after its first round instead, so that its first update comes minutes sooner
        (the same score: the base's sampling is seeded, whatever the adapter holds by then); and
        a node resumed without the base's score (stopped during that evaluation) scores it then."""
        if not self.every_rounds:
            return
        fresh_unshared = round_no == 0 and key not in self._shared
        if measure_base is not None and self._base_due is None and (fresh_unshared or base_missing):
            self._base_due = (measure_base, key)
            if round_no == 0:
                self._start_done = True
        if self._start_done:
            return
        if round_no > 0 and (round_no + 1) % self.every_rounds == 0:
            return  # a resume just before a due round: that round's end measures newer weights at once
        try:
            result = self._base_score(self._measure, key, should_stop) if round_no == 0 \
                else self._measure(round_no, should_stop)
        except Abandoned:
            return  # paused or stopped at once: the first scheduled evaluation measures it later
        self._pending = (result, round_no)
        self._start_done = True

    def after_round(self, round_no: int, should_stop: StopCheck | None = None,
                    trained: bool = True) -> HeldOutScore | None:
        """The score for this round's record: the start's, once (a record holds one score, and the
        base model's must not be lost: with `every_rounds = 1` the first round's own weights then go
        unmeasured, the second's are); else measured now when due (the update is applied, so it
        cannot be abandoned: the checkpoint must follow). The deferred base model's score comes
        after the first round that `trained` (the first update is what a new volunteer waits for),
        or BASE_WAITS_ROUNDS rounds at most, a due evaluation first; it may be abandoned
        (`should_stop`): it is then measured at a later round's end."""
        every, pending, self._pending = self.every_rounds, self._pending, None
        if pending is not None:
            return pending
        due = bool(every) and round_no % every == 0
        if (self._base_due is not None and (trained or round_no >= BASE_WAITS_ROUNDS)
                and (not due or every == 1)):
            try:
                result = self._base_score(*self._base_due, should_stop)
            except Abandoned:
                return None
            self._base_due = None
            return result, 0
        if due:
            return self._measure(round_no, None), round_no
        return None


def measure(sampler: Sampler, preset: Preset, prefill_answer: bool, max_new_tokens: int, levels: dict[str, int],
            weights_round: int, at_start: bool, emit: Listener, should_stop: StopCheck | None) -> EvalResult:
    """The held-out score of the weights after `weights_round`, told to the viewers; `at_start`:
    the start's evaluation (the first minute of a fresh node), shown as preparing, with progress."""
    report = None
    if at_start:
        what = ("scoring the base model on held-out tasks: the mark its progress starts from"
                if weights_round == 0 else f"scoring round {weights_round}'s weights on the held-out set")

        def report(done: int, total: int) -> None:
            emit(Preparing(what, done, total))
    result = evaluate(sampler, preset, prefill_answer, max_new_tokens, should_stop, levels=levels, on_progress=report)
    per = ", ".join(f"{d} {a:.0%}" for d, a in result.per_dataset.items())
    emit(Notice("info", f"held-out accuracy after round {weights_round}: {result.accuracy:.1%} ({per}; "
                        f"{result.tag_rate:.0%} of replies closed the tag)"))
    return result


def base_measure(sampler_now: Callable[[], Sampler], preset: Preset, prefill_answer: bool, max_new_tokens: int,
                 levels: dict[str, int], emit: Listener) -> Measure | None:
    """Scores the base model with the adapter off, on the levels given (the node's at its start),
    on whichever backend the node holds then; None where its sampler cannot switch the adapter off
    (the base is then scored first)."""
    if sampler_now().base_sampling() is None:
        return None

    def measure_base(weights_round: int, should_stop: StopCheck | None) -> EvalResult:
        sampler = sampler_now()
        with sampler.base_sampling():
            return measure(sampler, preset, prefill_answer, max_new_tokens, levels, 0, True, emit, should_stop)
    return measure_base


def base_score_missing(metrics_file: Path, round_no: int, every_rounds: int) -> bool:
    """Resumed early in its life without the base model's score in any record (stopped while the
    deferred evaluation ran): it is measured again. Later, an old record may have rolled away, and
    the base no longer matters beside the evaluations since."""
    if not 0 < round_no <= every_rounds:
        return False
    return not any(r.get("eval_of_round") == 0 for r in read_records(metrics_file))

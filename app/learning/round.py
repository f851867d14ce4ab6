"""One SAPO round, as steps that each return a value: draw the tasks → generate G completions each
→ score → (share) → build the training set (own groups with signal, rescued ones, peers' in the
places left; zero-advantage groups dropped) → one GRPO update once enough groups with right and
wrong replies have accumulated → hand-off → the record, assembled from those values
(round_assembly.py). The node runs the steps itself, with the swarm and the held-out score between
(node/loop.py: Node._run_round); `run_round` runs them for a caller that is not a node (bench, tests).

No network, no config: the round's settings come in as RoundSettings (node/round_settings.py).
The round owns no state of its own: the curriculum, the RNG and the groups waiting for a step are
passed in and only committed after the round succeeded, so an abandoned round changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ...backends.base import (Abandoned, Backend, ChatPrompt, GenerationResult, SamplingParams, StopCheck, TrainSample,
                              TrainStats)
from .curriculum import Curriculum
from .prompt import STOP, PromptFormat
from .rollout import QuestionGroup, ScoredCompletion, ShareCallback
from .draws import RoundDraws
from .round_assembly import RoundClosing, RoundOutcome, assemble  # step 8
from .group_selection import Selection, select_groups
from .screening import Screening, screen_peer_text
from .reserved import draw_task, of_preset, unreserved
from .rescue import Rescue, awaits_rescue, common_task, rescue
from .tasks import Preset, Task

@dataclass(frozen=True)
class RoundSettings:
    questions: int
    completions: int
    max_new_tokens: int
    temperature: float
    local_groups: int
    external_groups: int
    prefill_answer: bool
    format_bonus: float
    max_groups_per_peer: int | None = None
    fill: bool = True  # peers' groups fill the places own groups left without signal (round.peer_groups)
    # Step once this many groups with a strict signal have accumulated (0: any round with a signal).
    min_signal_groups: int = 0
    # Reasoning mode only: a peer's reply that surprises our policy by more than this, in nats per
    # token beyond its own entropy, is dropped with its group (learning/screening.py; 0: off).
    external_text_margin: float = 0.0
    model: str = ""  # the model's name, for the record (the caller knows it; a backend may not)
    # The first this many of a round's questions come from the swarm's common stream, and own
    # all-wrong groups on them wait for peers' right replies (learning/rescue.py).
    common_questions: int = 0
    rescue: bool = False
    swarm: str = "main"  # the common stream's key

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(self.prefill_answer)


PhaseCallback = Callable[[str], None]
ExternalSource = Callable[[], Sequence[QuestionGroup]]  # peers' verified groups, asked for at sampling
PhaseProgress = Callable[[str, int, int, int], None]  # (phase, done, total, tokens): see ProgressCallback
# (groups the update trained on, peers' groups among them) -> what the caller adds to the record
RoundCloser = Callable[[Sequence[QuestionGroup], Sequence[QuestionGroup]], RoundClosing]


def run_round(
    round_no: int,
    backend: Backend,
    preset: Preset,
    curriculum: Curriculum,
    settings: RoundSettings,
    draws: RoundDraws,
    external: Sequence[QuestionGroup] | ExternalSource = (),
    should_stop: StopCheck | None = None,
    on_phase: PhaseCallback | None = None,
    share: ShareCallback | None = None,
    on_progress: PhaseProgress | None = None,
    close: RoundCloser | None = None,
    waiting: Sequence[QuestionGroup] = (),
    awaiting_rescue: Sequence[QuestionGroup] = (),
) -> RoundOutcome:
    """The round's steps in order for a caller that is not a node (bench, tests): the node runs
    the same steps itself, with the swarm and the held-out score between (node/loop.py)."""
    started, watch = time.time(), Stopwatch()
    phase = on_phase or (lambda name: None)
    scored = own_groups(backend, preset, curriculum, settings, draws, watch, should_stop, phase, on_progress)
    if share is not None:
        phase("share")
        share(scored.groups)
        watch.lap("share")
    phase("sample")
    batch = select(round_no, scored, external() if callable(external) else external, settings, draws, backend,
                   preset, waiting, awaiting_rescue)
    watch.lap("sample")
    update = train(backend, batch, settings, watch, should_stop, phase, on_progress)
    closing = close(update.trained, batch.used_external) if close is not None else RoundClosing()
    return assemble(round_no, started, watch, curriculum, settings, preset, backend.info().name, scored, batch,
                    update, closing)


class Stopwatch:
    """Seconds per phase of a round, lap by lap (a phase run twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._clock
        self._clock = now


# ---- 1.-3. this round's own groups -------------------------------------------------------------
def own_groups(backend: Backend, preset: Preset, curriculum: Curriculum, settings: RoundSettings, draws: RoundDraws,
               watch: Stopwatch, should_stop: StopCheck | None = None, on_phase: PhaseCallback | None = None,
               on_progress: PhaseProgress | None = None) -> Scored:
    """Steps 1 to 3, each its phase and lap: draw the tasks, generate G replies each, score them."""
    phase = on_phase or (lambda name: None)
    phase("tasks")
    drawn = draw(preset, curriculum, settings, draws)
    watch.lap("tasks")
    phase("generate")
    generated = generate(backend, drawn, settings, draws, should_stop, on_progress)
    watch.lap("generate")
    phase("score")
    scored = score(drawn, generated, settings, curriculum)
    watch.lap("score")
    return scored


# ---- 1. tasks ----------------------------------------------------------------------------------
@dataclass
class Drawn:
    picks: list[tuple[str, int]]  # (dataset, level) of each question
    tasks: list[Task]
    prompts: list[ChatPrompt]  # each task as the node asks it
    common: set[str]  # the questions from the swarm's common stream


def draw(preset: Preset, curriculum: Curriculum, settings: RoundSettings, draws: RoundDraws) -> Drawn:
    """The round's questions, picked by the node's own curriculum; the first ones from the swarm's
    common stream (where peers meet on the same questions: learning/rescue.py); never a held-out
    question (learning/reserved.py)."""
    rng = draws.stream("tasks")
    picks = curriculum.pick(rng, settings.questions)
    tasks = [common_task(preset, dataset, level, settings.swarm, draws.common_window, rng)
             if i < settings.common_questions else draw_task(preset, dataset, level, rng)
             for i, (dataset, level) in enumerate(picks)]
    prompts = [settings.prompt_format.prompt(t.question) for t in tasks]
    return Drawn(picks, tasks, prompts, {t.question for t in tasks[:settings.common_questions]})


# ---- 2. generate ---------------------------------------------------------------------------------
def generate(backend: Backend, drawn: Drawn, settings: RoundSettings, draws: RoundDraws,
             should_stop: StopCheck | None = None, on_progress: PhaseProgress | None = None) -> GenerationResult:
    """G replies to each question, with the sampler's log-probs; Abandoned when told to stop."""
    params = SamplingParams(
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        stop=STOP,
        seed=int(draws.stream("sampling").integers(2**31)),
    )
    generated = backend.generate(drawn.prompts, settings.completions, params, should_stop or (lambda: False),
                                 _in_phase(on_progress, "generate"))
    if any(c.finish_reason == "abandoned" for group in generated.completions for c in group):
        raise Abandoned("generation abandoned")
    return generated


# ---- 3. score ------------------------------------------------------------------------------------
@dataclass
class Scored:
    groups: list[QuestionGroup]
    distinct_answers: list[int]  # per group
    format_bonus: float
    generated: GenerationResult
    common: set[str]  # the questions from the swarm's common stream (Drawn.common)


def score(drawn: Drawn, generated: GenerationResult, settings: RoundSettings, curriculum: Curriculum) -> Scored:
    """Every reply scored against the locally regenerated task, by this node's own verifier."""
    form = settings.prompt_format
    bonus = curriculum.format_bonus(settings.format_bonus)
    groups, distinct_answers = [], []
    for task, (_, level), prompt, prompt_ids, completions in zip(drawn.tasks, drawn.picks, drawn.prompts,
                                                                 generated.prompt_ids, generated.completions):
        scored, answers = [], set()
        for c in completions:
            s = form.score(task, c.text, bonus)
            scored.append(ScoredCompletion(c.text, c.token_ids, c.logprobs, c.finish_reason, s.strict, s.well_formed, s.reward))
            answers.add(s.answer)
        groups.append(QuestionGroup(task, level, prompt, prompt_ids, scored))
        distinct_answers.append(len(answers))
    return Scored(groups, distinct_answers, bonus, generated, drawn.common)


# ---- 5. select -----------------------------------------------------------------------------------
@dataclass
class Batch:
    """What the round trains on, and what it set aside."""

    offered: list[QuestionGroup]  # every peer group offered this round
    selection: Selection
    screening: Screening | None
    held_out: list[QuestionGroup]  # peers' groups on held-out questions
    other_preset: list[QuestionGroup]  # peers' groups of another preset
    rescued: Rescue | None
    own: list[QuestionGroup]  # this node's groups, rescued ones included
    groups: list[QuestionGroup]  # the batch: groups that waited for a step and this round's selection
    samples: list[TrainSample]
    signal_groups: int
    ready: bool  # the minimum batch is reached
    used_external: list[QuestionGroup]  # peers' groups that leave the pool: taken, screened out, set aside or rescuing


def select(round_no: int, scored: Scored, external: Sequence[QuestionGroup], settings: RoundSettings,
           draws: RoundDraws, backend: Backend, preset: Preset, waiting: Sequence[QuestionGroup] = (),
           awaiting_rescue: Sequence[QuestionGroup] = ()) -> Batch:
    """The training set: every own group with signal, and peers' groups in the places left, up to J
    (or the paper's fixed I local + J external: learning/group_selection.py); own all-wrong groups
    on common questions rescued by peers' right replies first. `external`: peers' verified groups,
    taken only now, so bundles fetched while the node generated are in."""
    groups = scored.groups
    offered = list(external)
    external, other_preset = of_preset(offered, preset.name)  # another preset's tasks: not this node's to learn
    external, held_out = unreserved(external, preset.name)  # a peer's group on a held-out question: never trained on
    # Rescue: own all-wrong groups on common questions (this round's, and earlier ones still
    # waiting) with peers' right replies on the same question added. A peer's group that rescued
    # one is not trained on again beside it.
    own, rescued, helped = groups, None, set()
    if settings.rescue:
        common = scored.common
        fresh = [replace(g, sampled_round=round_no) for g in groups if awaits_rescue(g, common)]
        rescued = rescue([*awaiting_rescue, *fresh], external, round_no)
        helped = {g.task.question for g in rescued.rescued}
        replaced = {g.task.question for g in rescued.rescued if g.sampled_round == round_no}  # this round's, rescued
        own = [g for g in groups if not (awaits_rescue(g, common) and g.task.question in replaced)] + rescued.rescued
        external = [g for g in external if g.task.question not in helped]
    selection = select_groups(
        own, external, settings.local_groups, settings.external_groups, draws.stream("selection"),
        settings.max_groups_per_peer, settings.fill,
    )
    # Peers' free text (reasoning mode) screened by our own policy: the verifier checks only the
    # answer. Dropped groups leave the pool like used ones; their slots stay empty this round.
    screening = _screen(selection.external, backend, settings)
    if screening is not None:
        selection = Selection(selection.local, screening.kept)
    # The batch: the groups still waiting for a step (the policy has not moved since they were
    # sampled; a peer's only while fresh) and this round's selection.
    batch = [g for g in waiting if g.fresh_at(round_no)] + selection.groups
    signal_groups = sum(g.strict_signal for g in batch)
    samples = training_samples(batch)
    ready = signal_groups >= settings.min_signal_groups and any(s.advantage != 0 for s in samples)
    # taken by the batch (trained now, or waiting), screened out, set aside, or used by a rescue
    used = list(selection.external) + (screening.dropped if screening else []) + held_out + other_preset
    taken = {id(g) for g in used}
    used += [g for g in offered if g.task.question in helped and id(g) not in taken]
    return Batch(offered, selection, screening, held_out, other_preset, rescued, own, batch, samples, signal_groups,
                 ready, used)


# ---- 6. train and 7. hand off -------------------------------------------------------------------
@dataclass
class Update:
    stats: TrainStats | None  # None: no step this round (the minimum batch is not reached)
    handoff_seconds: float
    trained: list[QuestionGroup]  # every group the update used
    waiting: list[QuestionGroup]  # selected, waiting for the next step


def train(backend: Backend, batch: Batch, settings: RoundSettings, watch: Stopwatch,
          should_stop: StopCheck | None = None, on_phase: PhaseCallback | None = None,
          on_progress: PhaseProgress | None = None) -> Update:
    """One GRPO update once enough groups with right and wrong replies have accumulated, and the
    adapter handed to the sampler; else the batch waits (bounded)."""
    phase = on_phase or (lambda name: None)
    stats, handoff = None, 0.0
    if batch.ready:
        phase("train")
        stats = backend.train_step(batch.samples, should_stop or (lambda: False), _in_phase(on_progress, "train"))
        watch.lap("train")
        phase("hand-off")
        handoff = backend.hand_off()
        watch.lap("hand-off")
    if not stats:  # no step (or one the backend found nothing to take): the batch waits on
        return Update(None, handoff, [], _bounded_wait(batch.groups, settings.min_signal_groups))
    return Update(stats, handoff, batch.groups, [])


def training_samples(groups: Sequence[QuestionGroup]) -> list[TrainSample]:
    """Every reply of the groups as a training sample, with its group's advantage."""
    return [
        TrainSample(g.prompt_ids, c.token_ids, adv, c.sampler_logprobs, sequence_behaviour_logprob=c.sender_logprob,
                    from_other_model=g.other_model or c.from_other_model, from_peer=g.source != "local" or c.peer is not None)
        for g in groups
        for c, adv in zip(g.completions, g.advantages())
        if c.token_ids
    ]


def _screen(external: Sequence[QuestionGroup], backend: Backend, settings: RoundSettings) -> Screening | None:
    """Peers' selected groups screened (learning/screening.py), or None where nothing is: with the
    `<answer>` prefill a reply has no free text, and the verifier checks all of it."""
    if settings.prefill_answer or settings.external_text_margin <= 0 or not external:
        return None
    return screen_peer_text(external, backend.token_surprise, settings.external_text_margin)


# Groups waiting for a step are bounded: when signal is scarce the oldest groups without right and
# wrong replies (a format-bonus spread only) go first, then the oldest.
WAITING_GROUPS_PER_SIGNAL_GROUP = 4


def _bounded_wait(batch: list[QuestionGroup], min_signal_groups: int) -> list[QuestionGroup]:
    cap = WAITING_GROUPS_PER_SIGNAL_GROUP * max(min_signal_groups, 1)
    kept = list(batch)
    for g in [g for g in batch if not g.strict_signal] + [g for g in batch if g.strict_signal]:
        if len(kept) <= cap:
            break
        kept.remove(g)
    return kept


def _in_phase(on_progress: PhaseProgress | None, phase: str):
    if on_progress is None:
        return None
    return lambda done, total, tokens: on_progress(phase, done, total, tokens)

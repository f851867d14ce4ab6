"""The node: rounds until told to stop, a checkpoint after every one. Viewers learn what happens
through events; the parts around the loop live in their own modules:

  backend_slot   the backend (built by backends.registry; released during long suspensions)
  resume         where to start from, and what a checkpoint holds
  held_out       when the held-out score is measured, and measuring it
  status         what viewers and `swarmling status` read of the node, and the log file's lines
  steering       stop / pause / resume, from any thread (what Node inherits)
  lifecycle      run / pause / stop requests and guest suspensions, as the loop reads them
  suspension     waiting while held (the model's memory released during long suspensions)
  reconfigure    a config changed while the node runs (what Node inherits)
  guest_monitor  the battery, hours, idle and disk rules, polled on a small thread
  control        the local socket behind `swarmling status|pause|resume|finish`
  state_lock     one node per state dir
  swarm.facade   peers' groups in, ours out (OfflineSwarm when the swarm is off)
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Sequence

from ...backends.base import Abandoned, Backend, StopCheck
from ...backends.registry import build_backend
from ..config import Config
from ..errors import NodeError
from ..events import (Listener, NodeStarted, Notice, PhaseChanged, Preparing, RoundFinished, RoundRollouts, StateChanged,
                      group_views)
from ..hardware import Hardware, detect
from ..learning.curriculum import Curriculum
from ..learning.draws import RoundDraws
from ..learning.evaluation import EvalResult
from ..learning.prompt import PromptFormat
from ..learning.rescue import clock_window
from ..learning.rollout import QuestionGroup
from ..learning.round import RoundClosing, RoundSettings, Stopwatch, assemble, own_groups, select, train  # step 8: round_assembly.py
from ..learning.tasks import Preset, load_preset
from ..metrics import append_record, reconcile
from ..models import ResolvedModel, resolve_model
from ..paths import Paths
from ..sizing import ResourceError, Sizing, memory_note, plan
from ..swarm.facade import OfflineSwarm, SwarmOpener, open_swarm
from .backend_slot import BackendBuilder, BackendSlot, backend_spec, loading_note, model_scale
from .best import Best, BestKeeper
from .checkpoint import round_folder
from .control import ControlServer, open_control
from .guest_monitor import GuestMonitor
from .held_out import HeldOutSchedule, Measure, base_measure, base_score_missing, measure
from .lifecycle import Intent, Lifecycle
from .progress import ProgressReporter
from .reconfigure import NodeReconfiguring
from .resume import find_start, restore, write_checkpoint
from .round_settings import intake_context, round_settings
from .state_lock import StateDirLock
from .steering import NodeControls
from .status import NodeStatus, StatusBoard
from .suspension import wait_while_held


class Node(NodeControls, NodeReconfiguring):
    def __init__(self, config: Config, paths: Paths, listener: Listener | None = None,
                 hardware: Hardware | None = None, build: BackendBuilder = build_backend,
                 connect: SwarmOpener = open_swarm, base_evals: dict | None = None) -> None:
        self.config = config
        self.paths = paths.ensure()
        self.hardware = hardware or detect()
        self._listener: Listener = listener or (lambda event: None)
        self._build = build
        self._connect = connect  # the swarm: libp2p (or none), or an experiment's in-memory exchange
        self.lifecycle = Lifecycle()
        self.board = StatusBoard()
        # What start() settles: the model, its preset and sizing, the seed and the RNGs.
        self.model: ResolvedModel | None = None
        self.preset: Preset | None = None
        self.sizing: Sizing | None = None
        self.slot: BackendSlot | None = None
        self.seed = 0  # each round's draws come from it (learning/draws.py)
        self.curriculum: Curriculum | None = None
        self.waiting: list[QuestionGroup] = []  # selected groups waiting for the minimum batch
        self.awaiting_rescue: list[QuestionGroup] = []  # own all-wrong common groups (learning/rescue.py)
        self.round = 0
        self._rounds_begun = False  # before the first round, the start's work is shown as preparing
        self.held_out = HeldOutSchedule(config.eval.every_rounds, self._measure, base_evals)
        self.best: BestKeeper | None = None  # start() reads it from the checkpoints
        self.swarm = OfflineSwarm(self.emit)
        # The services around the loop.
        self._lock = StateDirLock(self.paths.state_dir)
        self._control: ControlServer | None = None
        self.guest = GuestMonitor(config.resources, self.lifecycle, self.emit, self.paths.state_dir)

    # ---- what viewers and `swarmling status` see -------------------------------------------------
    def emit(self, event) -> None:
        """Tell the viewers, and keep what `status()` and the log file need."""
        self.board.observe(event)
        self._listener(event)

    def status(self) -> NodeStatus:
        """For `swarmling status`: safe to read from any thread."""
        backend = self.backend
        return self.board.snapshot(suspended_for=self.suspended_for,
                                   model=self.model.name if self.model is not None else None,
                                   backend=backend.info().name if backend is not None else None,
                                   swarm_host=self.swarm.health())

    @property
    def backend(self) -> Backend | None:
        return self.slot.backend if self.slot is not None else None

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(self.config.reward.prefill_answer)

    # ---- start / resume ----------------------------------------------------------------------
    def start(self) -> None:
        self._lock.acquire()
        cfg = self.config
        if cfg.resources.nice:
            with contextlib.suppress(OSError):
                os.nice(cfg.resources.nice)  # the owner's programs come first
        self.guest.update(cfg.resources)  # the config may have changed since __init__
        self.preset = load_preset(cfg.round.preset)
        self.model = resolve_model(cfg.model.name, self.paths.cache_dir)
        scale = model_scale(self.model)
        try:
            self.sizing = plan(cfg, self.hardware, self.preset, scale)
        except ResourceError as exc:
            raise NodeError(str(exc)) from None
        if note := memory_note(cfg, self.sizing.build, scale):
            self.emit(Notice("info", note))
        start = find_start(self.paths.checkpoints, self.model.name, cfg.run.seed)
        self.seed = start.seed
        spec = backend_spec(cfg, self.paths, self.sizing.build, self.model, self.seed % 2**31)
        self.slot = BackendSlot(spec, self.paths.checkpoints, self._build)
        self.emit(Preparing(loading_note(self.model, self.paths.cache_dir)))
        backend = self.slot.open()
        self.curriculum, self.waiting, self.awaiting_rescue = restore(start, backend, self.preset, self.emit)
        try:
            self.curriculum.focus(cfg.round.datasets, cfg.round.levels)
        except ValueError as exc:
            raise NodeError(f"round.datasets / round.levels: {exc}") from None
        self.round = start.round
        self.board.resumed(start.round, start.saved_record)
        reconcile(self.paths.metrics_file, self.round, start.saved_record)
        self.held_out.resumed_at(self.round, start.saved_record)
        self.best = BestKeeper(self.paths.checkpoints, self.preset.name)
        self.swarm = self._connect(cfg, self.paths, self.model.name, self.emit)
        info = backend.info()
        self.emit(NodeStarted(
            backend=info.name, device=info.device, model=self.model.name, preset=self.preset.name,
            reason=self.sizing.backend.reason, resumed_round=self.round, shape=self.sizing.shape,
            peer_id=self.swarm.peer_id, swarm=self.swarm.name,
        ))
        self.swarm.announce_state()
        self._control = open_control(self, self.paths.state_dir, self.emit)
        self.guest.start()

    def round_settings(self) -> RoundSettings:
        return round_settings(self.config, self.sizing.shape, self.slot.spec.temperature, self.model.name)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, rounds: int | None = None) -> int:
        if self.slot is None:
            self.start()
        done = 0
        if not self.lifecycle.held:
            self.emit(StateChanged("running"))
            self.held_out.at_start(self.round, self._base_score_key(), self._drops_round, self._base_measure(),
                                   base_score_missing(self.paths.metrics_file, self.round, self.config.eval.every_rounds))
        while rounds is None or done < rounds:
            wait_while_held(self.lifecycle, self.slot, self.config.resources.release_memory_after_s, self.emit)
            if self.lifecycle.stopping:
                break
            round_no = self.round + 1
            try:
                self._run_round(round_no)
            except Abandoned:
                if self.lifecycle.intent is Intent.STOP_NOW:
                    self.emit(Notice("info", f"round {round_no} abandoned; the node resumes after round {self.round}"))
                    break
                why = "pause" if self.lifecycle.intent is Intent.PAUSE_NOW else f"suspend ({self.suspended_for})"
                self.emit(Notice("info", f"round {round_no} dropped to {why}; it starts over on resume"))
                continue
            done += 1
        return done

    def _run_round(self, round_no: int) -> None:
        """One round, step by step (learning/round.py), with the swarm and the held-out score between."""
        self._rounds_begun = True
        started, watch = time.time(), Stopwatch()
        settings, backend = self.round_settings(), self.slot.backend
        stop, progress = self._drops_round, ProgressReporter(round_no, self.emit)
        last = self.board.last_record
        # The common stream's window (learning/rescue.py): the clock's, or the round's in lockstep runs
        window = clock_window(time.time()) if self.config.round.common_window == "clock" else None
        draws = RoundDraws(self.seed, round_no, window)
        # Which bundles to fetch depends on what the network delivered: a stream of its own.
        # (its held-out evaluation, when it had one, left out: a round's length, not an evaluation's)
        self.swarm.start_round(draws.stream("fetches"), self.config,
                               last.wall_seconds - (last.eval_seconds or 0.0) if last else None)
        phase = functools.partial(self._on_phase, round_no)
        # 1. tasks, 2. generate, 3. score
        scored = own_groups(backend, self.preset, self.curriculum, settings, draws, watch, stop, phase, progress)
        # 4. share the round's groups with the swarm (returns at once; the network is another thread)
        prefill = self.prompt_format.prefill
        share = self.swarm.sharer(round_no, prefill)
        if share is not None:
            phase("share")
            share(scored.groups)
            watch.lap("share")
        # 5. peers' groups, verified now (bundles fetched while we generated are in), and the training set
        phase("sample")
        intake = intake_context(self.config, self.sizing.shape, backend, self.model.name, self.curriculum)
        external = self.swarm.external_groups(intake, self.config.round.external_groups > 0, round_no)
        batch = select(round_no, scored, external, settings, draws, backend, self.preset, self.waiting,
                       self.awaiting_rescue)
        watch.lap("sample")
        # 6. one GRPO update once the minimum batch is reached, and 7. the hand-off
        update = train(backend, batch, settings, watch, stop, phase, progress)
        # 8. the swarm's round ends, and the held-out score when due (the update is applied)
        closing = self._close_round(round_no, update.trained, batch.used_external)
        # 9. the record, then the checkpoint
        outcome = assemble(round_no, started, watch, self.curriculum, settings, self.preset, backend.info().name,
                           scored, batch, update, closing)
        write_checkpoint(
            self.paths.checkpoints, round_no, seed=self.seed, model=self.model.name,
            curriculum=outcome.curriculum, waiting=outcome.waiting, awaiting_rescue=outcome.awaiting_rescue,
            record=outcome.record,
            save_backend=self.slot.backend.save_state, keep=self.config.checkpoint.keep, last_good_round=self.round,
        )
        record = outcome.record
        if record.eval_of_round == round_no and self.best.improves(record.eval_accuracy, round_no):
            self.best.keep(round_folder(self.paths.checkpoints, round_no), record.eval_accuracy, round_no)
        self.curriculum, self.waiting, self.awaiting_rescue = outcome.curriculum, outcome.waiting, outcome.awaiting_rescue
        self.round = round_no
        append_record(self.paths.metrics_file, outcome.record.to_dict())
        self.emit(RoundFinished(outcome.record))
        self.emit(RoundRollouts(round_no, group_views(round_no, outcome.groups, outcome.used_external,
                                                      outcome.trained, prefill)))
        self.swarm.announce_state()

    def _close_round(self, round_no: int, trained: Sequence[QuestionGroup],
                     used_external: Sequence[QuestionGroup]) -> RoundClosing:
        """The round's update is applied: the swarm's figures, and the held-out score when due."""
        rejected, swarm_stats = self.swarm.finish_round(trained, used_external)
        held_out = self.held_out.after_round(round_no, self._drops_round, trained=bool(trained))
        best = self.best.best
        if held_out is not None and self.best.improves(held_out[0].accuracy, held_out[1]):
            best = Best(held_out[0].accuracy, held_out[1])  # kept once its checkpoint is written
        return RoundClosing(rejected, swarm_stats, held_out, (best.accuracy, best.round) if best else None)

    def _base_score_key(self) -> tuple:
        """What the base model's held-out score depends on (an experiment's nodes share it)."""
        return self.model.name, self.preset.name, self.config.reward.prefill_answer, self.sizing.shape.max_new_tokens

    def _measure(self, weights_round: int, should_stop: StopCheck | None) -> EvalResult:
        return measure(self.slot.backend, self.preset, self.config.reward.prefill_answer, self.sizing.shape.max_new_tokens,
                       self.curriculum.levels(), weights_round, not self._rounds_begun, self.emit, should_stop)

    def _base_measure(self) -> Measure | None:
        return base_measure(lambda: self.slot.backend, self.preset, self.config.reward.prefill_answer,
                            self.sizing.shape.max_new_tokens, self.curriculum.levels(), self.emit)

    def _drops_round(self) -> bool:
        return self.lifecycle.drops_round(self.config.resources.on_suspend == "abandon")

    def _on_phase(self, round_no: int, phase: str) -> None:
        self.board.phase = phase
        self.emit(PhaseChanged(round_no, phase))

    def close(self) -> None:
        self.guest.stop()
        if self._control is not None:
            self._control.stop()
            self._control = None
        self.swarm.stop()
        self.swarm = OfflineSwarm(self.emit)
        if self.slot is not None:
            self.slot.close()
        self._lock.release()

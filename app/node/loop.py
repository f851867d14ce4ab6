"""The node: rounds until told to stop, a checkpoint after every one. Viewers learn what happens
through events; the parts around the loop live in their own modules:

  backend_slot   the backend (built by backends.factory; released during long suspensions)
  resume         where to start from, and what a checkpoint holds
  lifecycle      run / pause / stop requests and guest suspensions, from any thread
  guest_monitor  the battery, hours, idle and disk rules, polled on a small thread
  control        the local socket behind `swarmling status|pause|resume|finish`
  state_lock     one node per state dir
  swarm.facade   peers' groups in, ours out (OfflineSwarm when the swarm is off)
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
import os
import time
from dataclasses import asdict, replace

import msgspec
import numpy as np
import psutil

from ...backends.base import Abandoned, Backend
from .. import metrics as metrics_log
from ...backends.factory import build_backend
from .backend_slot import BackendBuilder, BackendSlot, backend_spec, model_scale
from ..config import LIVE_KEYS, Config, ConfigError, changed_keys
from .control import ControlServer, open_control
from ..learning.curriculum import Curriculum
from ..sizing import ResourceError, Resolved, memory_note, resolve
from ..errors import NodeError
from ..learning.evaluation import EvalResult, eval_fields, evaluate
from ..events import Listener, NodeStarted, Notice, PhaseChanged, RoundFinished, RoundRollouts, StateChanged, group_views
from .guest import Readings
from .guest_monitor import GuestMonitor
from ..hardware import Hardware, choose_backend, detect
from .lifecycle import Intent, Lifecycle
from ..metrics import format_round
from ..models import ResolvedModel, resolve_model
from ..paths import Paths
from .progress import ProgressReporter
from .resume import find_start, restore, write_checkpoint
from ..learning.prompt import PromptFormat
from ..learning.round import RoundSettings, run_round
from ..learning.round_record import RoundRecord
from .state_lock import StateDirLock
from ..swarm.facade import OfflineSwarm, SwarmOpener, open_swarm
from ..swarm.verification.intake import IntakeContext
from ..learning.tasks import Preset, TaskError, load_preset

# Round lines and notices for the log file (the CLI attaches a rotating file handler); the
# terminal gets them from the headless printer or the TUI instead.
rounds_log = logging.getLogger("swarmling.rounds")
rounds_log.propagate = False


class Node:
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
        self.state, self.state_detail, self.phase = "starting", "", ""
        # What start() settles: the model, its preset and settings, the seed and the RNGs.
        self.model: ResolvedModel | None = None
        self.preset: Preset | None = None
        self.resolved: Resolved | None = None
        self.slot: BackendSlot | None = None
        self.seed = 0
        self.rng = np.random.default_rng(0)
        # Which bundles to fetch depends on what the network delivered: a separate stream, so the
        # round's own draws (tasks, sampling, the training set) stay reproducible from the seed.
        self.rng_network = np.random.default_rng([0, 1])
        self.curriculum: Curriculum | None = None
        self.round = 0
        self.last_record: RoundRecord | None = None
        self._recent_swarm_shares: deque[float] = deque(maxlen=10)  # rounds that trained only
        # The held-out score of the weights the node started from, for its first round's record.
        self._start_eval: EvalResult | None = None
        self._start_evaluated = False
        # An experiment's nodes that start from the same base model share its (deterministic) score.
        self._base_evals = base_evals
        self.swarm = OfflineSwarm(self.emit)
        # The services around the loop.
        self._lock = StateDirLock(self.paths.state_dir)
        self._control: ControlServer | None = None
        self._guest = GuestMonitor(config.resources, self.lifecycle, self.emit, self.paths.state_dir)

    # ---- what viewers and `swarmling status` see -------------------------------------------------
    def emit(self, event) -> None:
        """Tell the viewers, and keep what `status()` and the log file need."""
        if isinstance(event, StateChanged):
            self.state, self.state_detail = event.state, event.detail
        elif isinstance(event, RoundFinished):
            self.last_record = event.record
            if event.record.external_advantage_share is not None:
                self._recent_swarm_shares.append(event.record.external_advantage_share)
            rounds_log.info(format_round(event.record))
        elif isinstance(event, Notice):
            level = {"error": logging.ERROR, "warning": logging.WARNING}.get(event.level, logging.INFO)
            rounds_log.log(level, event.text)
        self._listener(event)

    def status(self) -> dict:
        """For `swarmling status`: plain data, safe to read from any thread."""
        m, backend = self.last_record, self.backend
        return {
            "state": self.state,
            "detail": self.state_detail,
            "round": self.round,
            "phase": self.phase if self.state == "running" else "",
            "suspended_for": self.suspended_for,
            "pid": os.getpid(),
            "model": self.model.name if self.model is not None else None,
            "backend": backend.info().name if backend is not None else None,
            "peers": m.swarm.peers if m is not None and m.swarm is not None else None,
            "swarm_host": self.swarm.health(),
            "swarm_share": self._swarm_share(),
            "last_round": {k: getattr(m, k) for k in ("round", "reward_mean", "solved", "questions", "wall_seconds",
                                                       "tokens_per_s")} if m is not None else None,
        }

    def _swarm_share(self) -> float | None:
        """The external groups' share of the advantage mass over the last 10 rounds that trained."""
        shares = self._recent_swarm_shares
        return round(sum(shares) / len(shares), 3) if shares else None

    @property
    def backend(self) -> Backend | None:
        return self.slot.backend if self.slot is not None else None

    @property
    def suspended_for(self) -> str | None:
        """Why a guest rule (battery, hours, idle, disk) holds the node."""
        return self.lifecycle.suspended_for

    @property
    def paused(self) -> bool:
        return self.lifecycle.paused

    # ---- start / resume ----------------------------------------------------------------------
    def start(self) -> None:
        self._lock.acquire()
        cfg = self.config
        if cfg.resources.nice:
            with contextlib.suppress(OSError):
                os.nice(cfg.resources.nice)  # the owner's programs come first
        self._guest.update(cfg.resources)  # the config may have changed since __init__
        self.preset = load_preset(cfg.round.preset)
        choice = choose_backend(self.hardware, cfg.backend.kind)
        self.model = resolve_model(cfg.model.name, self.paths.cache_dir)
        scale = model_scale(self.model)
        try:
            self.resolved = resolve(cfg, self.hardware, self.preset, scale)
        except ResourceError as exc:
            raise NodeError(str(exc)) from None
        if note := memory_note(cfg, self.resolved, scale):
            self.emit(Notice("info", note))
        start = find_start(self.paths.checkpoints, self.model.name, cfg.run.seed)
        self.seed = start.seed
        spec = backend_spec(choice.name, cfg, self.paths, self.resolved, self.model, self.seed % 2**31)
        self.slot = BackendSlot(spec, self.paths.checkpoints, self._build)
        backend = self.slot.open()
        self.rng = np.random.default_rng(self.seed)
        self.rng_network = np.random.default_rng([self.seed, 1])
        self.curriculum = restore(start, backend, self.rng, self.preset)
        self.round = start.round
        metrics_log.reconcile(self.paths.metrics_file, self.round, start.saved_record)
        # The weights we resume from were measured when their round ended: no need to again.
        saved = start.saved_record or {}
        self._start_evaluated = self.round > 0 and saved.get("eval_of_round") == self.round
        self.swarm = self._connect(cfg, self.paths, self.model.name, self.emit)
        info = backend.info()
        self.emit(NodeStarted(
            backend=info.name, device=info.device, model=self.model.name, preset=self.preset.name,
            reason=choice.reason, resumed_round=self.round, settings=asdict(self.resolved),
            peer_id=self.swarm.peer_id, swarm=self.swarm.name,
        ))
        self.swarm.announce_state()
        self._control = open_control(self, self.paths.state_dir, self.emit)
        self._guest.start()

    def round_settings(self) -> RoundSettings:
        # Sampling temperature is the backend's: the trainer scores at the one it was built with.
        return replace(RoundSettings.from_config(self.config, self.resolved), temperature=self.slot.spec.temperature)

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(self.config.reward.prefill_answer)

    # ---- control (any thread) ----------------------------------------------------------------
    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM / quit: abandon or finish the round in flight, as configured."""
        finish = self.config.run.on_stop == "finish"
        self.lifecycle.stop(finish_round=finish)
        self.emit(StateChanged("stopping", "finishing the round in flight" if finish else ""))

    def pause(self, finish_round: bool = False) -> None:
        """Stop taking rounds: at once (the round in flight is dropped; it costs only its own work),
        or after the round in flight is trained and checkpointed."""
        self.lifecycle.pause(finish_round)
        if finish_round:
            self.emit(StateChanged("finishing", "pausing after this round"))
        else:
            # A training pass cannot be cut short: it ends at its microbatch's end (seconds to tens
            # of seconds on a small CPU); generation stops at the next token.
            self.emit(StateChanged("pausing", "the training pass in flight ends first" if self.phase == "train" else ""))

    def resume(self) -> None:
        was_paused = self.state in ("paused", "pausing")
        before = self.lifecycle.resume()
        if was_paused and self.suspended_for is None:  # say so at once; the loop wakes within 0.5 s
            self.emit(StateChanged("running"))
        if before is Intent.PAUSE_AFTER_ROUND:  # the round in flight goes on; nothing waited yet
            self.emit(StateChanged("running"))

    def check_guest(self, readings: Readings) -> None:
        """Apply the guest rules to these readings now (the monitor's thread does it periodically)."""
        self._guest.check(readings)

    def check_config(self, config: Config) -> None:
        """Raise ConfigError when this machine cannot run `config` (a memory ceiling that no round
        fits), so that the settings screen refuses it before the file is written."""
        if self.slot is None:  # not started: start() checks, and says so
            return
        try:
            # with the running preset (the live keys apply now) and the new one (at the next start)
            for preset in (self.preset, load_preset(config.round.preset)):
                resolve(config, self.hardware, preset, model_scale(self.model))
        except (ResourceError, TaskError) as exc:
            raise ConfigError(str(exc)) from None

    def apply_config(self, config: Config) -> list[str]:
        """Take a changed config from the settings screen. The round mix applies from the next
        round; returns the changed keys that need a restart (backend, model, preset, swarm)."""
        changed = changed_keys(self.config, config)
        self.config = config
        if self.slot is None:  # not started yet: start() reads the new config
            return []
        # Threads and the training memory settings are fixed by the backend already built.
        try:
            fresh = resolve(config, self.hardware, self.preset, model_scale(self.model))
        except ResourceError as exc:  # check_config refuses this before saving; a caller that did not check
            self.emit(Notice("warning", f"keeping the running round settings: {exc}"))
            fresh = self.resolved
        self.resolved = replace(fresh, threads=self.resolved.threads, microbatch_tokens=self.resolved.microbatch_tokens,
                                activation_checkpointing=self.resolved.activation_checkpointing,
                                kind=self.resolved.kind, memory_limit=self.resolved.memory_limit)
        self._guest.update(config.resources)  # the guest rules take the new settings at the next check
        return [key for key in changed if key not in LIVE_KEYS]

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, rounds: int | None = None) -> int:
        if self.slot is None:
            self.start()
        done = 0
        if not self.lifecycle.held:
            self.emit(StateChanged("running"))
            self._evaluate_start()
        while rounds is None or done < rounds:
            self._wait_while_held()
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
        started = time.time()
        prefill = self.prompt_format.prefill
        self.swarm.start_round(self.rng_network, self._inbound_budget())
        outcome = run_round(
            round_no,
            self.slot.backend,
            self.preset,
            self.curriculum,
            self.round_settings(),
            self.rng,
            # Peers' bundles that arrived while we generated are verified when the round samples.
            external=lambda: self.swarm.external_groups(self._intake_context(), self.config.round.external_groups > 0,
                                                        round_no),
            should_stop=self._drops_round,
            on_phase=lambda phase: self._on_phase(round_no, phase),
            share=self.swarm.sharer(round_no, prefill),
            on_progress=ProgressReporter(round_no, self.emit),
        )
        rejected, swarm_stats = self.swarm.finish_round(outcome.trained, outcome.used_external)
        every = self.config.eval.every_rounds
        if every and round_no % every == 0:
            # The update is applied: measuring it can no longer be abandoned (the checkpoint must follow).
            evaluated_round, result = round_no, self._evaluate(round_no)
        else:
            evaluated_round, result = self.round, self._start_eval
        self._start_eval = None
        record = msgspec.structs.replace(
            outcome.record,
            external_rejected=rejected,
            timestamp=started,
            wall_seconds=round(time.time() - started, 3),
            model=self.model.name,
            preset=self.preset.name,
            backend=self.slot.backend.info().name,
            rss_bytes=psutil.Process().memory_info().rss,
            swarm=swarm_stats,
            **(eval_fields(result, evaluated_round) if result is not None else {}),
        )
        write_checkpoint(
            self.paths.checkpoints, round_no, seed=self.seed, model=self.model.name, rng=self.rng,
            curriculum=outcome.curriculum, record=record, save_backend=self.slot.backend.save_state,
            keep=self.config.checkpoint.keep, last_good_round=self.round,
        )
        self.curriculum = outcome.curriculum
        self.round = round_no
        metrics_log.append_record(self.paths.metrics_file, record.to_dict())
        self.emit(RoundFinished(record))
        self.emit(RoundRollouts(round_no, group_views(round_no, outcome.groups, outcome.used_external,
                                                      outcome.trained, prefill)))
        self.swarm.announce_state()

    def _wait_while_held(self) -> None:
        """Paused or suspended: wait (giving the model's memory back during long suspensions)."""
        lifecycle = self.lifecycle
        if not lifecycle.held:
            return
        self.emit(StateChanged("paused") if lifecycle.paused else StateChanged("suspended", self.suspended_for or ""))
        held_since = time.monotonic()
        release_after = self.config.resources.release_memory_after_s
        while lifecycle.held and not lifecycle.stopping:
            lifecycle.wait(0.5)
            long_suspension = release_after and time.monotonic() - held_since >= release_after
            if self.suspended_for is not None and long_suspension and self.slot.release():
                self.emit(Notice("info", "released the model's memory while suspended; it reloads on resume"))
        if lifecycle.stopping:
            return
        if self.slot.released:
            self.emit(StateChanged("starting", "reloading the model"))
            self.slot.reload()
        self.emit(StateChanged("running"))

    def _evaluate_start(self) -> None:
        """The held-out score of the weights the node starts from (the base model on a fresh start)."""
        if not self.config.eval.every_rounds or self._start_evaluated:
            return
        shared_key = (self.model.name, self.preset.name, self.config.reward.prefill_answer, self.resolved.max_new_tokens)
        shared = self._base_evals if self._base_evals is not None and self.round == 0 else {}
        try:
            self._start_eval = shared.get(shared_key) or self._evaluate(self.round, self._drops_round)
        except Abandoned:
            return  # paused or stopped at once: the first eval round measures it later
        shared[shared_key] = self._start_eval
        self._start_evaluated = True

    def _evaluate(self, weights_round: int, should_stop=None) -> EvalResult:
        result = evaluate(self.slot.backend, self.preset, self.config.reward.prefill_answer,
                          self.resolved.max_new_tokens, should_stop)
        per = ", ".join(f"{d} {a:.0%}" for d, a in result.per_dataset.items())
        self.emit(Notice("info", f"held-out accuracy after round {weights_round}: {result.accuracy:.1%} ({per}; "
                                 f"{result.tag_rate:.0%} of replies closed the tag)"))
        return result

    def _drops_round(self) -> bool:
        return self.lifecycle.drops_round(self.config.resources.on_suspend == "abandon")

    def _on_phase(self, round_no: int, phase: str) -> None:
        self.phase = phase
        self.emit(PhaseChanged(round_no, phase))

    def _inbound_budget(self) -> int | None:
        """resources.bandwidth_kib_s over the last round's length, if that is below the per-round cap."""
        cap = self.config.resources.bandwidth_kib_s
        if cap is None:
            return None
        seconds = (self.last_record.wall_seconds if self.last_record is not None else 0.0) or 30.0
        return min(self.config.swarm.inbound_kib_per_round, int(cap * seconds)) * 1024

    def _intake_context(self) -> IntakeContext:
        return IntakeContext.for_sampler(
            self.slot.backend, self.model.name, prompt=self.prompt_format,
            format_bonus=self.curriculum.format_bonus(self.config.reward.format_bonus),
            max_new_tokens=self.resolved.max_new_tokens, group_size=self.resolved.completions,
        )

    def close(self) -> None:
        self._guest.stop()
        if self._control is not None:
            self._control.stop()
            self._control = None
        self.swarm.stop()
        self.swarm = OfflineSwarm(self.emit)
        if self.slot is not None:
            self.slot.close()
        self._lock.release()

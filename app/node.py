"""The node: builds the backend, resumes from the last good checkpoint, runs rounds until told
to stop, and checkpoints after every round. Viewers learn what happens through events."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil

from ..backends.base import Abandoned, Backend
from . import metrics as metrics_log
from .control import ControlError, ControlServer
from .guest import GuestPolicy, GuestSettings, read_os
from .checkpoint import latest_checkpoint, save_checkpoint
from .config import Config
from .curriculum import Curriculum
from .defaults import ResourceError, Resolved, estimate_peak_bytes, resolve
from .events import (
    CompletionView,
    GroupView,
    Listener,
    NodeStarted,
    Notice,
    PhaseChanged,
    Progress,
    RoundFinished,
    RoundRollouts,
    StateChanged,
    SwarmUpdated,
)
from .hardware import Hardware, choose_backend, detect
from .models import ResolvedModel, resolve_model
from .paths import Paths
from .reward import OPEN
from .round import SYSTEM_PROMPT, RoundSettings, run_round
from .swarm.inbox import Inbox
from .swarm.intake import IntakeContext
from .swarm.pool import GroupPool
from .metrics import format_round
from .tasks import load_preset

if TYPE_CHECKING:
    from .swarm.swarm import Swarm

STATE_VERSION = 1
# Round lines and notices for the log file (the CLI attaches a rotating file handler); the
# terminal gets them from the headless printer or the TUI instead.
rounds_log = logging.getLogger("swarmling.rounds")
rounds_log.propagate = False
PROGRESS_INTERVAL_S = 0.25  # viewers redraw a few times a second at most


class NodeError(RuntimeError):
    """A problem the user can act on; the message says what to do."""


def build_backend(name: str, config: Config, paths: Paths, resolved: Resolved, model: ResolvedModel, seed: int) -> Backend:
    from ..backends.torch_grpo import GrpoSettings
    from ..backends.torch_lora import LoraSettings, OptimSettings

    t = config.train
    lora = LoraSettings(t.lora_r, t.lora_alpha, t.lora_dropout, tuple(t.target_modules))
    optim = OptimSettings(t.learning_rate, t.weight_decay, t.max_grad_norm, resolved.microbatch_tokens)
    grpo = GrpoSettings(t.clip_low, t.clip_high, t.importance_cap, t.external_importance_cap)
    if name == "cuda":
        import torch

        from ..backends.cuda import BackendMemoryError, CudaBackend, CudaSettings

        if not torch.cuda.is_available():
            raise NodeError(
                f"backend.kind = 'cuda', but torch {torch.__version__} sees no CUDA device: install a CUDA build of "
                "torch for your driver, or set backend.kind = 'auto'"
            )
        from ..backends.hf_from_gguf import converted_folder

        folder = model.hf_dir or converted_folder(model.gguf, paths.cache_dir)
        try:
            return CudaBackend(CudaSettings(folder, model.name, config.round.temperature, "cuda", lora, optim, grpo, seed,
                                            full=t.mode == "full"))
        except BackendMemoryError as exc:
            raise NodeError(str(exc)) from None
    if name == "mlx":
        if t.mode == "full":
            raise NodeError("train.mode = 'full' is for the CUDA backend; the MLX backend trains a LoRA adapter")
        try:
            from ..backends.mlx import MlxBackend, MlxSettings
        except ImportError:
            raise NodeError(
                "backend.kind = 'mlx', but MLX is not installed: pip install 'swarmling[mlx]' (on Linux it runs on "
                "the CPU, slowly)"
            ) from None
        from ..backends.hf_from_gguf import converted_folder

        folder = model.hf_dir or converted_folder(model.gguf, paths.cache_dir)
        return MlxBackend(MlxSettings(folder, model.name, config.round.temperature, lora, optim, grpo, seed))
    if name != "cpu":
        raise NodeError(f"backend {name!r} is not available in this release")
    if t.mode == "full":
        raise NodeError(
            "train.mode = 'full' needs the CUDA backend: on the CPU, llama.cpp samples through a LoRA adapter, "
            "so only the adapter can train; set train.mode = 'lora'"
        )
    if model.gguf is None:
        raise NodeError(
            f"the CPU backend samples with llama.cpp, which needs a .gguf file; {model.name!r} is a Hugging Face "
            "model (use it on a CUDA GPU, or convert it to GGUF)"
        )
    from ..backends.cpu import CpuBackend, CpuSettings

    return CpuBackend(
        CpuSettings(
            gguf=model.gguf,
            model_name=model.name,
            threads=resolved.threads,
            cache_dir=paths.cache_dir,
            runtime_dir=paths.runtime_dir,
            temperature=config.round.temperature,
            lora=lora,
            optim=optim,
            grpo=grpo,
            seed=seed,
        )
    )


class Node:
    def __init__(self, config: Config, paths: Paths, listener: Listener | None = None, hardware: Hardware | None = None):
        self.config = config
        self.paths = paths.ensure()
        self._listener: Listener = listener or (lambda event: None)
        self.state, self.state_detail = "starting", ""
        self.last_record: dict | None = None
        self.suspended_for: str | None = None  # why a guest rule (battery, hours, idle, disk) holds the node
        self._control = None
        self._guest_stop = threading.Event()
        self._guest_thread: threading.Thread | None = None
        self.hardware = hardware or detect()
        self.stop_now = threading.Event()  # abandon the round in flight
        self.stop_after_round = threading.Event()  # finish the round in flight, then stop
        # Pausing keeps the process (and the swarm's serving of our bundles) alive but stops rounds.
        self.pause_now = threading.Event()  # abandon the round in flight, then wait
        self.pause_after_round = threading.Event()  # finish the round in flight, then wait
        self._wake = threading.Event()  # resume or stop while paused
        self._phase = ""  # the phase in flight, for what pausing will wait for
        self.backend: Backend | None = None
        self.round = 0
        self._lock_file = None
        # Peers' bundles arrive here from the network thread; rounds take J groups from the pool.
        self.inbox = Inbox(GroupPool())
        self.swarm: Swarm | None = None
        self._alone_notice: bool | None = None

    def emit(self, event) -> None:
        """Tell the viewers, and keep what `status()` and the log file need."""
        if isinstance(event, StateChanged):
            self.state, self.state_detail = event.state, event.detail
        elif isinstance(event, RoundFinished):
            self.last_record = event.metrics
            rounds_log.info(format_round(event.metrics))
        elif isinstance(event, Notice):
            rounds_log.log(logging.ERROR if event.level == "error" else logging.WARNING if event.level == "warning"
                           else logging.INFO, event.text)
        self._listener(event)

    def status(self) -> dict:
        """For `swarmling status`: plain data, safe to read from any thread."""
        m = self.last_record or {}
        backend = self.backend
        return {
            "state": self.state,
            "detail": self.state_detail,
            "round": self.round,
            "phase": self._phase if self.state == "running" else "",
            "suspended_for": self.suspended_for,
            "pid": os.getpid(),
            "model": self.model.name if hasattr(self, "model") else None,
            "backend": backend.info().name if backend is not None else None,
            "peers": m.get("peers"),
            "last_round": {k: m.get(k) for k in ("round", "reward_mean", "solved", "questions", "wall_seconds",
                                                  "tokens_per_s")} if m else None,
        }

    def _take_lock(self) -> None:
        """One node per state dir: two writers would interleave checkpoints and metrics."""
        path = self.paths.state_dir / "node.lock"
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise NodeError(
                f"another swarmling node (pid {holder}) is running with {self.paths.state_dir}; stop it first, "
                "or give this one its own --home"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_file = handle

    # ---- start / resume ----------------------------------------------------------------------
    def start(self) -> None:
        self._take_lock()
        cfg = self.config
        if cfg.resources.nice:
            with contextlib.suppress(OSError):
                os.nice(cfg.resources.nice)  # the owner's programs come first
        self.preset = load_preset(cfg.round.preset)
        choice = choose_backend(self.hardware, cfg.backend.kind)
        model = resolve_model(cfg.model.name, self.paths.cache_dir)
        try:
            self.resolved = resolve(cfg, self.hardware, self.preset, _model_scale(model))
        except ResourceError as exc:
            raise NodeError(str(exc)) from None
        if cfg.resources.max_memory_gb is not None and cfg.train.microbatch_tokens is None:
            self.emit(Notice("info", f"memory ceiling {cfg.resources.max_memory_gb:g} GB: training microbatch "
                                     f"{self.resolved.microbatch_tokens} tokens (estimated peak "
                                     f"{estimate_peak_bytes(self.resolved.microbatch_tokens, _model_scale(model)) / 1e9:.1f} GB)"))
        self._choice = choice
        checkpoint = latest_checkpoint(self.paths.checkpoints)
        if checkpoint is not None:
            saved_model = checkpoint.state.get("model")
            if saved_model != model.name:
                raise NodeError(
                    f"the checkpoints in {self.paths.checkpoints} were trained on model {saved_model!r}, not "
                    f"{model.name!r}: run with --model {saved_model}, or use another --home for the new model"
                )
            seed = int(checkpoint.state["seed"])
        else:
            seed = cfg.run.seed if cfg.run.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self.seed = seed
        self.model = model
        self.backend = build_backend(choice.name, cfg, self.paths, self.resolved, model, seed % 2**31)
        self.rng = np.random.default_rng(seed)
        # Which bundles to fetch depends on what the network delivered: a separate stream, so the
        # round's own draws (tasks, sampling, the training set) stay reproducible from the seed.
        self.rng_network = np.random.default_rng([seed, 1])
        self.curriculum = Curriculum(self.preset)
        last_record = None
        if checkpoint is not None:
            try:
                self.backend.load_state(checkpoint.path)
            except (ValueError, KeyError, RuntimeError) as exc:
                raise NodeError(
                    f"could not resume from {checkpoint.path}: {exc}. Restore the matching [train] settings, "
                    "or use another --home to start fresh"
                ) from exc
            self.round = checkpoint.round
            self.rng.bit_generator.state = checkpoint.state["rng"]
            self.curriculum = Curriculum.from_dict(self.preset, checkpoint.state.get("curriculum"))
            last_record = checkpoint.state.get("metrics")
        metrics_log.reconcile(self.paths.metrics_file, self.round, last_record)
        if cfg.swarm.enabled:
            self.swarm = self._start_swarm()
        info = self.backend.info()
        self.emit(
            NodeStarted(
                backend=info.name,
                device=info.device,
                model=model.name,
                preset=self.preset.name,
                reason=choice.reason,
                resumed_round=self.round,
                settings=asdict(self.resolved),
                peer_id=self.swarm.peer_id if self.swarm is not None else "",
                swarm=cfg.swarm.name if self.swarm is not None else "",
            )
        )
        self._emit_swarm()
        self._start_control()
        self._start_guest()

    # ---- the control socket and the guest rules ------------------------------------------------
    def _start_control(self) -> None:
        server = ControlServer(self, self.paths.state_dir)
        try:
            server.start()
        except (ControlError, OSError) as exc:  # the node still runs; only `swarmling pause` etc. cannot reach it
            self.emit(Notice("warning", f"no control socket ({exc}); `swarmling status/pause/resume` will not work"))
            return
        self._control = server

    def _start_guest(self) -> None:
        r = self.config.resources
        self._policy = GuestPolicy(self._guest_settings())
        readings = read_os(self.paths.state_dir)
        if r.only_when_idle and readings.idle_seconds is None:
            self.emit(Notice("warning", "resources.only_when_idle is on, but this system does not say how long it has "
                                        "been idle (macOS, or X11 with xprintidle, do): the rule is not applied"))
        self.check_guest(readings)  # before the first round, not 15 s into it

        def loop() -> None:
            while not self._guest_stop.wait(r.check_every_s):
                try:
                    self.check_guest(read_os(self.paths.state_dir))
                except Exception as exc:  # noqa: BLE001 — a sensor hiccup must not stop the node
                    rounds_log.warning("could not read the machine's state: %s", exc)

        self._guest_thread = threading.Thread(target=loop, name="swarmling-guest", daemon=True)
        self._guest_thread.start()

    def _guest_settings(self) -> GuestSettings:
        r = self.config.resources
        return GuestSettings(
            pause_on_battery=r.pause_on_battery, resume_after_plugged_s=r.resume_after_plugged_s,
            only_when_idle=r.only_when_idle, idle_after_s=r.idle_after_s, windows=r.windows,
            min_free_disk_bytes=r.min_free_disk_mb * 2**20,
        )

    def check_guest(self, readings) -> None:
        """Suspend or resume by the guest rules (any thread; readings injected in tests)."""
        reason = self._policy.decide(readings)
        if reason and reason != self.suspended_for:
            first = self.suspended_for is None
            self.suspended_for = reason
            if first:
                what = "the round in flight finishes first" if self.config.resources.on_suspend == "finish" else ""
                self.emit(Notice("info", f"suspended: {reason}" + (f" ({what})" if what else "")))
            self.emit(StateChanged("suspended", reason))
        elif reason is None and self.suspended_for is not None:
            self.suspended_for = None
            self.emit(Notice("info", "resuming: nothing holds the node back any more"))
            self._wake.set()

    def _release_backend(self) -> None:
        """A long suspension: give the model's memory back to the machine's owner."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None
            import gc

            gc.collect()
            self.emit(Notice("info", "released the model's memory while suspended; it reloads on resume"))

    def _reload_backend(self) -> None:
        self.backend = build_backend(self._choice.name, self.config, self.paths, self.resolved, self.model, self.seed % 2**31)
        checkpoint = latest_checkpoint(self.paths.checkpoints)
        if checkpoint is not None:
            self.backend.load_state(checkpoint.path)

    def _start_swarm(self) -> Swarm:
        from .swarm.host import SwarmError
        from .swarm.identity import IdentityError, load_or_create
        from .swarm.swarm import Swarm, SwarmSettings

        sw = self.config.swarm
        try:
            identity = load_or_create(self.paths.data_dir)
            swarm = Swarm(
                SwarmSettings(sw.name, sw.listen_host, sw.port, sw.bootstrap, sw.peers, sw.mdns, sw.inbound_kib_per_round * 1024),
                identity,
                self.inbox,
                self.paths.data_dir,
                self.model.name,
            )
            swarm.start()
        except IdentityError as exc:
            raise NodeError(str(exc)) from None
        except ValueError as exc:  # a bootstrap / peer address that does not parse
            raise NodeError(f"[swarm] {exc}") from None
        except SwarmError as exc:
            raise NodeError(
                f"{exc}. Another program (or swarmling node) may hold port {sw.port}: pick another with "
                "--port, --set swarm.port=0 for any free port, or run alone with --set swarm.enabled=false"
            ) from None
        self.emit(Notice("info", f"swarm {sw.name!r}: peer {identity.peer_id}, listening on {', '.join(swarm.listen_addrs)}"))
        return swarm

    def round_settings(self) -> RoundSettings:
        cfg, res = self.config, self.resolved
        return RoundSettings(
            questions=res.questions,
            completions=res.completions,
            max_new_tokens=res.max_new_tokens,
            temperature=cfg.round.temperature,
            local_groups=res.local_groups,
            external_groups=cfg.round.external_groups,
            prefill_answer=cfg.reward.prefill_answer,
            format_bonus=cfg.reward.format_bonus,
            max_groups_per_peer=cfg.round.max_groups_per_peer,
        )

    # ---- control (any thread) ----------------------------------------------------------------
    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM / quit: abandon or finish the round in flight, as configured."""
        if self.config.run.on_stop == "finish":
            self.stop_after_round.set()
        else:
            self.stop_now.set()
        self.emit(StateChanged("stopping", "finishing the round in flight" if self.config.run.on_stop == "finish" else ""))
        self._wake.set()

    def pause(self, finish_round: bool = False) -> None:
        """Stop taking rounds: at once (the round in flight is dropped; it costs only its own work),
        or after the round in flight is trained and checkpointed."""
        if finish_round:
            self.pause_after_round.set()
            self.emit(StateChanged("finishing", "pausing after this round"))
        else:
            self.pause_now.set()
            # A training pass cannot be cut short: it ends at its microbatch's end (seconds to tens
            # of seconds on a small CPU); generation stops at the next token.
            busy = "the training pass in flight ends first" if self._phase == "train" else ""
            self.emit(StateChanged("pausing", busy))

    def resume(self) -> None:
        was_finishing = self.pause_after_round.is_set() and not self.pause_now.is_set()
        was_paused = self.state in ("paused", "pausing")
        self.pause_now.clear()
        self.pause_after_round.clear()
        self._wake.set()
        if was_paused and self.suspended_for is None:  # say so at once; the loop wakes within 0.5 s
            self.emit(StateChanged("running"))
        if was_finishing:  # the round in flight goes on; nothing waited yet
            self.emit(StateChanged("running"))

    @property
    def paused(self) -> bool:
        return self.pause_now.is_set() or self.pause_after_round.is_set()

    def apply_config(self, config: Config) -> list[str]:
        """Take a changed config from the settings screen. The round mix applies from the next
        round; returns the changed keys that need a restart (backend, model, preset, swarm)."""
        live = {"round.questions", "round.external_groups", "round.local_groups", "round.max_groups_per_peer",
                "round.completions", "round.max_new_tokens", "round.temperature", "run.on_stop",
                "resources.pause_on_battery", "resources.resume_after_plugged_s", "resources.only_when_idle",
                "resources.idle_after_s", "resources.windows", "resources.on_suspend", "resources.min_free_disk_mb",
                "resources.release_memory_after_s", "resources.bandwidth_kib_s"}
        old, new = self.config.model_dump(), config.model_dump()
        changed = [f"{s}.{k}" for s in new for k in new[s] if new[s][k] != old[s][k]]
        if self.backend is None:  # not started yet: start() reads the new config
            self.config = config
            return []
        restart = [key for key in changed if key not in live]
        resolved = resolve(config, self.hardware, self.preset)
        # Threads and microbatch are fixed by the backend already built.
        self.resolved = type(resolved)(**(asdict(resolved) | {"threads": self.resolved.threads,
                                                               "microbatch_tokens": self.resolved.microbatch_tokens}))
        self.config = config
        if hasattr(self, "_policy"):  # the guest rules take the new settings at the next check
            self._policy = GuestPolicy(self._guest_settings())
        return restart

    # ---- the loop ----------------------------------------------------------------------------
    def _held(self) -> bool:
        return self.paused or self.suspended_for is not None

    def _wait_while_paused(self) -> None:
        if not self._held():
            return
        if self.paused:
            self.emit(StateChanged("paused"))
        else:
            self.emit(StateChanged("suspended", self.suspended_for or ""))
        held_since = time.monotonic()
        release_after = self.config.resources.release_memory_after_s
        while self._held() and not (self.stop_now.is_set() or self.stop_after_round.is_set()):
            self._wake.wait(0.5)
            self._wake.clear()
            if (self.suspended_for is not None and release_after and self.backend is not None
                    and time.monotonic() - held_since >= release_after):
                self._release_backend()
        if self.stop_now.is_set() or self.stop_after_round.is_set():
            return
        if self.backend is None:
            self.emit(StateChanged("starting", "reloading the model"))
            self._reload_backend()
        self.emit(StateChanged("running"))

    def _round_should_stop(self) -> bool:
        if self.stop_now.is_set() or self.pause_now.is_set():
            return True
        return self.suspended_for is not None and self.config.resources.on_suspend == "abandon"

    def _on_phase(self, round_no: int, phase: str) -> None:
        self._phase = phase
        self.emit(PhaseChanged(round_no, phase))

    def _progress(self, round_no: int):
        last = {"t": 0.0, "phase": "", "start": time.perf_counter()}

        def report(phase: str, done: int, total: int, tokens: int) -> None:
            now = time.perf_counter()
            if phase != last["phase"]:
                last.update(phase=phase, start=now)
            elif now - last["t"] < PROGRESS_INTERVAL_S and done < total:
                return
            last["t"] = now
            rate = tokens / (now - last["start"]) if phase == "generate" and now > last["start"] else 0.0
            self.emit(Progress(round_no, phase, done, total, rate))

        return report

    def run(self, rounds: int | None = None) -> int:
        if self.backend is None:
            self.start()
        done = 0
        if not self._held():
            self.emit(StateChanged("running"))
        while rounds is None or done < rounds:
            self._wait_while_paused()
            if self.stop_now.is_set() or self.stop_after_round.is_set():
                break
            round_no = self.round + 1
            started = time.time()
            if self.swarm is not None:
                # Fetches run on the network thread while this round generates.
                self.swarm.plan_fetches(self.rng_network, self._inbound_budget())
            intakes = []

            def take_external():
                # Bundles that arrived so far (fetched while we generated) are verified now.
                intake = self.inbox.drain(self._intake_context())
                intakes.append(intake)
                for reason in intake.reasons:
                    self.emit(Notice("warning", f"refused from a peer: {reason}"))
                if self.swarm is not None:
                    for peer, count in intake.by_peer.items():
                        self.swarm.penalize(peer, count)
                return self.inbox.pool.available() if self.config.round.external_groups else []

            try:
                outcome = run_round(
                    round_no,
                    self.backend,
                    self.preset,
                    self.curriculum,
                    self.round_settings(),
                    self.rng,
                    external=take_external,
                    should_stop=self._round_should_stop,
                    on_phase=lambda phase: self._on_phase(round_no, phase),
                    share=self._share(round_no) if self.swarm is not None else None,
                    on_progress=self._progress(round_no),
                )
            except Abandoned:
                if self.stop_now.is_set():
                    self.emit(Notice("info", f"round {round_no} abandoned; the node resumes after round {self.round}"))
                    break
                why = "pause" if self.pause_now.is_set() else f"suspend ({self.suspended_for})"
                self.emit(Notice("info", f"round {round_no} dropped to {why}; it starts over on resume"))
                continue
            self.inbox.pool.mark_used(outcome.used_external)
            record = outcome.metrics | {
                "external_rejected": sum(i.rejected for i in intakes),
                "timestamp": started,
                "wall_seconds": round(time.time() - started, 3),
                "model": self.model.name,
                "preset": self.preset.name,
                "backend": self.backend.info().name,
                # Resident memory after the round: a leak shows as a trend over hours (rl-swarm's
                # Mac users saw 87 GB after 18 h), so every record carries it.
                "rss_bytes": psutil.Process().memory_info().rss,
            }
            if self.swarm is not None:
                admitted: dict[str, int] = {}
                for intake in intakes:
                    for peer, count in intake.admitted_by_peer.items():
                        admitted[peer] = admitted.get(peer, 0) + count
                self.swarm.record_intake(admitted, outcome.trained)
                record |= self.swarm.round_stats()
                self._tell_if_alone(record)
            self._checkpoint(round_no, record, outcome.curriculum)
            self.curriculum = outcome.curriculum
            self.round = round_no
            metrics_log.append_record(self.paths.metrics_file, record)
            self.emit(RoundFinished(record))
            prefill = OPEN if self.config.reward.prefill_answer else ""
            self.emit(RoundRollouts(round_no, _group_views(round_no, outcome, prefill)))
            self._emit_swarm()
            done += 1
        return done

    def _inbound_budget(self) -> int | None:
        """resources.bandwidth_kib_s over the last round's length, if that is below the per-round cap."""
        cap = self.config.resources.bandwidth_kib_s
        if cap is None:
            return None
        seconds = (self.last_record or {}).get("wall_seconds") or 30.0
        return min(self.config.swarm.inbound_kib_per_round, int(cap * seconds)) * 1024

    def _emit_swarm(self) -> None:
        if self.swarm is None:
            return
        bytes_in, bytes_out = self.swarm.totals()
        self.emit(SwarmUpdated(self.swarm.peer_id, tuple(self.swarm.listen_addrs), self.swarm.peer_views(), bytes_in, bytes_out))

    def _share(self, round_no: int):
        prefill = OPEN if self.config.reward.prefill_answer else ""

        def share(groups) -> None:
            self.swarm.share(groups, round_no, prefill)

        return share

    def _tell_if_alone(self, record: dict) -> None:
        alone = record["peers"] == 0
        if alone and self._alone_notice is not True:
            self.emit(Notice("info", "no peers connected: training on local groups only (still looking for some)"))
        elif not alone and self._alone_notice:
            self.emit(Notice("info", f"connected to {record['peers']} peer(s)"))
        self._alone_notice = alone

    def _intake_context(self) -> IntakeContext:
        return IntakeContext(
            system_prompt=SYSTEM_PROMPT,
            prefill=OPEN if self.config.reward.prefill_answer else "",
            format_bonus=self.curriculum.format_bonus(self.config.reward.format_bonus),
            max_completion_tokens=2 * self.resolved.max_new_tokens,  # other tokenizers split differently
            encode_prompt=self.backend.encode_prompt,
            tokenize=self.backend.tokenize,
        )

    def _checkpoint(self, round_no: int, record: dict, curriculum: Curriculum) -> None:
        state = {
            "version": STATE_VERSION,
            "round": round_no,
            "seed": self.seed,
            "model": self.model.name,
            "rng": self.rng.bit_generator.state,
            "curriculum": curriculum.to_dict(),
            "metrics": record,
        }
        try:
            save_checkpoint(self.paths.checkpoints, round_no, state, self.backend.save_state, self.config.checkpoint.keep)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NodeError(
                    f"disk full while saving round {round_no} to {self.paths.checkpoints}: free some space and "
                    f"restart; the checkpoint of round {self.round} is intact"
                ) from exc
            raise NodeError(f"could not save the checkpoint of round {round_no}: {exc}") from exc

    def close(self) -> None:
        self._guest_stop.set()
        if self._control is not None:
            self._control.stop()
            self._control = None
        if self.swarm is not None:
            self.swarm.stop()
            self.swarm = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None


def _group_views(round_no: int, outcome, prefill: str) -> tuple[GroupView, ...]:
    """The round's own groups and the peers' groups it trained on, as plain data for viewers
    (replies shown whole: with the `<answer>` the node pre-started them with)."""
    trained = {id(g) for g in outcome.trained}
    groups = [*outcome.groups, *outcome.used_external]
    return tuple(
        GroupView(
            round=round_no,
            source=g.source,
            dataset=g.task.spec.dataset,
            level=g.level,
            question=g.task.question,
            completions=tuple(CompletionView(prefill + c.text, c.reward, c.strict) for c in g.completions),
            trained=id(g) in trained,
        )
        for g in groups
    )


def _model_scale(model: ResolvedModel) -> float:
    """Model size relative to the shipped 135M one, for memory estimates."""
    if model.gguf is not None:
        return max(1.0, model.gguf.stat().st_size / 98e6)  # the shipped Q4_1 file is 98 MB
    stored = sum(f.stat().st_size for f in model.hf_dir.glob("*.safetensors")) if model.hf_dir else 0
    return max(1.0, stored / 540e6)  # 135M parameters in fp32

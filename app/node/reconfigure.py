"""A config changed while the node runs (the TUI's settings screen): whether this machine can run
it, and what of it applies at once. The backend keeps what it was built with (threads, the
training microbatch, checkpointing, the memory limit); the round's shape, the mix and the guest
rules apply from the next round; anything else waits for a restart (config.LIVE_KEYS)."""

from __future__ import annotations

from dataclasses import replace

from ..config import LIVE_KEYS, Config, ConfigError, changed_keys
from ..events import Listener, Notice
from ..hardware import Hardware
from ..learning.tasks import Preset, TaskError, load_preset
from ..models import ResolvedModel
from ..sizing import ResourceError, RoundShape, Sizing, plan, round_shape
from .backend_slot import BackendSlot, model_scale
from .guest_monitor import GuestMonitor
from .held_out import HeldOutSchedule


class NodeReconfiguring:
    """Part of `Node` (node/loop.py), which provides these attributes."""

    config: Config
    hardware: Hardware
    preset: Preset | None
    model: ResolvedModel | None
    sizing: Sizing | None
    slot: BackendSlot | None
    guest: GuestMonitor
    held_out: HeldOutSchedule
    emit: Listener

    def check_config(self, config: Config) -> None:
        """Raise ConfigError when this machine cannot run `config` (a memory ceiling that no round
        fits), so that the settings screen refuses it before the file is written."""
        if self.slot is not None:  # not started: start() checks, and says so
            check_runnable(config, self.hardware, self.preset, self.model)

    def apply_config(self, config: Config) -> list[str]:
        """Take a changed config from the settings screen; returns the changed keys that need a
        restart (backend, model, preset, swarm)."""
        old, self.config = self.config, config
        if self.slot is None:  # not started yet: start() reads the new config
            return []
        try:
            self.sizing = replace(self.sizing, shape=live_shape(config, self.sizing, self.preset, self.model))
        except ResourceError as exc:  # check_config refuses this before saving; a caller that did not check
            self.emit(Notice("warning", f"keeping the running round settings: {exc}"))
        self.guest.update(config.resources)  # the guest rules take the new settings at the next check
        self.held_out.every_rounds = config.eval.every_rounds
        return restart_keys(old, config)


def check_runnable(config: Config, hardware: Hardware, running_preset: Preset, model: ResolvedModel) -> None:
    """ConfigError when this machine cannot run `config` (a memory ceiling that no round fits),
    with the running preset (the live keys apply now) and the new one (at the next start)."""
    try:
        for preset in (running_preset, load_preset(config.round.preset)):
            plan(config, hardware, preset, model_scale(model))
    except (ResourceError, TaskError) as exc:
        raise ConfigError(str(exc)) from None


def live_shape(config: Config, sizing: Sizing, preset: Preset, model: ResolvedModel) -> RoundShape:
    """The round's shape under the new config, on the backend already built; ResourceError when
    it does not fit under the memory ceiling."""
    return round_shape(config, preset, sizing.build, model_scale(model))


def restart_keys(old: Config, new: Config) -> list[str]:
    """The changed keys that apply only at the next start."""
    return [key for key in changed_keys(old, new) if key not in LIVE_KEYS]

"""A config changed while the node runs (the TUI's settings screen): whether this machine can run
it, and what of it applies at once. The backend keeps what it was built with (threads, the
training microbatch, checkpointing, the memory limit); the round's shape, the mix and the guest
rules apply from the next round; anything else waits for a restart (config.LIVE_KEYS)."""

from __future__ import annotations

from ..config import LIVE_KEYS, Config, ConfigError, changed_keys
from ..hardware import Hardware
from ..learning.tasks import Preset, TaskError, load_preset
from ..models import ResolvedModel
from ..sizing import ResourceError, RoundShape, Sizing, plan, round_shape
from .backend_slot import model_scale


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

"""Configuration: a TOML file, environment variables and CLI flags, checked against one schema.

Precedence: CLI (`--set section.key=value` and dedicated flags) > environment
(`SWARMLING_SECTION__KEY=value`) > the config file > built-in defaults. Keys left unset (None)
get per-hardware defaults later (see `defaults.py`). Unknown keys and bad values are errors that
name the key, where the value came from, and what is accepted.

  schema      the sections, keys, defaults and checks; LIVE_KEYS (what a running node takes)
  loading     file, environment and command line into a checked Config, or a ConfigError
  describing  `swarmling config` and `config --keys`
"""

from .describing import describe_config, describe_keys
from .loading import ENV_NOT_KEYS, ENV_PREFIX, env_overrides, load_config, parse_value
from .schema import (
    LIVE_KEYS,
    PEER_ADDR,
    WINDOW,
    BackendSection,
    CheckpointSection,
    Config,
    ConfigError,
    EvalSection,
    LoggingSection,
    ModelSection,
    ResourcesSection,
    RewardSection,
    RoundSection,
    RunSection,
    SwarmSection,
    TrainSection,
    changed_keys,
    mix_problem,
    parse_window,
)

__all__ = [
    "ENV_NOT_KEYS", "ENV_PREFIX", "LIVE_KEYS", "PEER_ADDR", "WINDOW", "BackendSection", "CheckpointSection", "Config",
    "ConfigError", "EvalSection", "LoggingSection", "ModelSection", "ResourcesSection", "RewardSection",
    "RoundSection", "RunSection", "SwarmSection", "TrainSection", "changed_keys", "describe_config", "describe_keys",
    "env_overrides", "load_config", "mix_problem", "parse_value", "parse_window",
]

"""Where swarmling keeps things (platformdirs), with one override for tests, sims and services.

SWARMLING_HOME=/some/dir (or --home) puts config, data, state, cache and logs under that one
folder, so several nodes can run side by side on one machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import platformdirs

APP = "swarmling"


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    state_dir: Path
    cache_dir: Path
    log_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def checkpoints(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def metrics_file(self) -> Path:
        return self.state_dir / "metrics.jsonl"

    @property
    def runtime_dir(self) -> Path:
        """Scratch files the running node rewrites (the live llama.cpp adapter); per node."""
        return self.state_dir / "runtime"

    def ensure(self) -> Paths:
        for p in (self.config_dir, self.data_dir, self.state_dir, self.cache_dir, self.log_dir):
            p.mkdir(parents=True, exist_ok=True)
        return self

    def as_dict(self) -> dict[str, str]:
        return {
            "config file": str(self.config_file),
            "data": str(self.data_dir),
            "state (checkpoints, metrics)": str(self.state_dir),
            "cache (converted model)": str(self.cache_dir),
            "logs": str(self.log_dir),
        }


def resolve_paths(home: str | os.PathLike | None = None) -> Paths:
    home = home or os.environ.get("SWARMLING_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        paths = Paths(root / "config", root / "data", root / "state", root / "cache", root / "logs")
    else:
        paths = Paths(
            Path(platformdirs.user_config_dir(APP)),
            Path(platformdirs.user_data_dir(APP)),
            Path(platformdirs.user_state_dir(APP)),
            Path(platformdirs.user_cache_dir(APP)),
            Path(platformdirs.user_log_dir(APP)),
        )
    # The converted model (hundreds of MB, a minute to make) can be shared by nodes and tests.
    shared_cache = os.environ.get("SWARMLING_CACHE_DIR")
    if shared_cache:
        paths = replace(paths, cache_dir=Path(shared_cache).expanduser().resolve())
    return paths

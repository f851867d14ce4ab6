"""The node's backend: described from the config, built by `backends.registry`, and released
during a long suspension (the model's memory goes back to the machine's owner) then rebuilt
from the latest checkpoint on resume."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

from ...backends.base import Backend, BackendUnavailable
from ...backends.registry import build_backend
from ...backends.hf_from_gguf import is_converted
from ...backends.settings import BackendSpec, GrpoSettings, LoraSettings, OptimSettings
from .checkpoint import latest_checkpoint
from ..config import Config
from ..sizing import BuildSettings
from ..errors import NodeError
from ..models import ResolvedModel
from ..paths import Paths

BackendBuilder = Callable[[BackendSpec], Backend]


def loading_note(model: ResolvedModel, cache_dir: Path) -> str:
    """What loading the backend involves: on a first run, the GGUF model's one-time conversion
    into the folder every backend's trainer loads."""
    if model.gguf is not None and not is_converted(model.gguf, cache_dir):
        return f"loading {model.name}, and converting it for the trainer (once; about a minute on a small CPU)"
    return f"loading {model.name}"


def backend_spec(config: Config, paths: Paths, build: BuildSettings, model: ResolvedModel, seed: int) -> BackendSpec:
    t = config.train
    return BackendSpec(
        kind=build.kind,
        model_name=model.name,
        gguf=model.gguf,
        hf_dir=model.hf_dir,
        cache_dir=paths.cache_dir,
        runtime_dir=paths.runtime_dir,
        threads=build.threads,
        temperature=config.round.temperature,
        lora=LoraSettings.from_config(t),
        optim=OptimSettings.from_config(t, build.microbatch_tokens, build.activation_checkpointing),
        grpo=GrpoSettings.from_config(t),
        seed=seed,
        full=t.mode == "full",
        cpu_trainer=build.cpu_trainer,
        cpu_sampler=build.cpu_sampler,
    )


def model_scale(model: ResolvedModel) -> float:
    """Model size relative to the shipped 135M one, for memory estimates."""
    if model.gguf is not None:
        return max(1.0, model.gguf.stat().st_size / 98e6)  # the shipped Q4_1 file is 98 MB
    stored = sum(f.stat().st_size for f in model.hf_dir.glob("*.safetensors")) if model.hf_dir else 0
    return max(1.0, stored / 540e6)  # 135M parameters in fp32


class BackendSlot:
    def __init__(self, spec: BackendSpec, checkpoints: Path, build: BackendBuilder = build_backend) -> None:
        self.spec = spec
        self.checkpoints = checkpoints
        self._build = build
        self.backend: Backend | None = None

    def open(self) -> Backend:
        try:
            self.backend = self._build(self.spec)
        except BackendUnavailable as exc:
            raise NodeError(str(exc)) from None
        return self.backend

    @property
    def released(self) -> bool:
        return self.backend is None

    def release(self) -> bool:
        """Free the model's memory; False when it was not loaded."""
        if self.backend is None:
            return False
        self.backend.close()
        self.backend = None
        gc.collect()
        return True

    def reload(self) -> Backend:
        """Build the backend again, with the adapter of the latest checkpoint."""
        backend = self.open()
        checkpoint = latest_checkpoint(self.checkpoints)
        if checkpoint is not None:
            backend.load_state(checkpoint.path)
        return backend

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None

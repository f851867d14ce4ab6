"""What every backend that trains with the shared `TorchLoraTrainer` does the same way (the CPU
and CUDA backends): the update, the trainer's switches and the checkpoint's adapter + optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .base import Backend, ProgressCallback, StopCheck, TrainerSwitches, TrainSample, TrainStats
from .torch_lora import TorchLoraTrainer


class TorchTrainedBackend(Backend):
    """What every backend that trains with the shared `TorchLoraTrainer` does the same way: the
    update and the checkpoint's adapter + optimizer. Loading ends with `hand_off()`, so the sampler
    serves the restored policy whatever it is (a llama.cpp adapter, or the trainer's own model)."""

    trainer: TorchLoraTrainer

    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        return self.trainer.train_step(samples, should_stop, on_progress)

    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        return self.trainer.token_surprise(samples)

    def switches(self) -> TrainerSwitches:
        return TrainerSwitches(shared_prefix=self.trainer.shared_prefix,
                               activation_checkpointing=self.trainer.activation_checkpointing)

    def set_switches(self, switches: TrainerSwitches) -> None:
        self.trainer.shared_prefix = switches.shared_prefix
        if switches.activation_checkpointing is not None:
            self.trainer.activation_checkpointing = switches.activation_checkpointing

    def save_adapter(self, directory: Path) -> None:
        self.trainer.save_adapter(directory)

    def load_adapter(self, directory: Path) -> None:
        self.trainer.load_adapter(directory)
        self.hand_off()

    def save_state(self, directory: Path) -> None:
        self.trainer.save_adapter(directory)
        self.trainer.save_optimizer(directory)

    def load_state(self, directory: Path) -> None:
        self.trainer.load_adapter(directory)
        self.trainer.load_optimizer(directory)
        self.hand_off()

"""Backend settings for tests from the node's configuration defaults (`app/config/schema.py` is their
one source): what a node with an untouched config trains with."""

from __future__ import annotations

from dataclasses import replace

from swarmling.app.config import Config
from swarmling.backends.settings import GrpoSettings, LoraSettings, OptimSettings

# `train.microbatch_tokens` defaults to "sized from memory"; tests take a fixed budget.
TEST_MICROBATCH_TOKENS = 2048


def lora_settings(**changes) -> LoraSettings:
    return replace(LoraSettings.from_config(Config().train), **changes)


def optim_settings(**changes) -> OptimSettings:
    return replace(OptimSettings.from_config(Config().train, TEST_MICROBATCH_TOKENS, False), **changes)


def grpo_settings(**changes) -> GrpoSettings:
    return replace(GrpoSettings.from_config(Config().train), **changes)


def trainer_settings() -> dict:
    """lora=, optim=, grpo= keywords for a backend's settings."""
    return {"lora": lora_settings(), "optim": optim_settings(), "grpo": grpo_settings()}

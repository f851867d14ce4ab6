"""Verifiable tasks from reasoning-gym, named by a spec any node can regenerate from.

A TaskSpec (preset, dataset, config, seed, index) determines the question and its true answer:
reasoning-gym is pinned, and the datasets whose items depend on PYTHONHASHSEED are refused. The
answer and the score are always recomputed locally from the spec, never taken from anyone.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

# Items of these depend on PYTHONHASHSEED, so two processes disagree on them (measured).
NONDETERMINISTIC = frozenset(
    {"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"}
)


class TaskError(ValueError):
    pass


@dataclass(frozen=True)
class TaskSpec:
    preset: str
    dataset: str
    config: str  # canonical JSON of the reasoning-gym config (one of the preset's levels)
    seed: int
    index: int

    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config)

    def as_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "dataset": self.dataset, "config": self.config_dict(), "seed": self.seed, "index": self.index}


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    question: str
    entry: dict[str, Any]  # the reasoning-gym item (question, answer, metadata) for scoring

    @property
    def question_hash(self) -> str:
        return question_hash(self.question)


def question_hash(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:32]


def canonical_config(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


# Seeds are split in two: training rounds draw below EVAL_SEED, the held-out evaluation set uses
# EVAL_SEED and up, so no round can ever train on an evaluation item.
EVAL_SEED = 2**31 - 2**16


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    max_new_tokens: int
    levels: dict[str, tuple[str, ...]]  # dataset -> canonical configs, easiest first
    # Datasets whose own scorer grades real structure (kept as partial credit); every other
    # dataset's reply is right (1) or wrong (0). See the preset files for why each is listed.
    partial_credit: frozenset[str] = frozenset()

    @property
    def datasets(self) -> tuple[str, ...]:
        return tuple(self.levels)

    def spec(self, dataset: str, level: int, seed: int, index: int) -> TaskSpec:
        return TaskSpec(self.name, dataset, self.levels[dataset][level], seed, index)

    def training_spec(self, dataset: str, level: int, rng) -> TaskSpec:
        """A training draw from `rng` (a numpy Generator): a seed below EVAL_SEED, any index."""
        return self.spec(dataset, level, int(rng.integers(EVAL_SEED)), int(rng.integers(1_000_000)))

    def level_of(self, spec: TaskSpec) -> int:
        """The level a spec's config belongs to; TaskError if it is not one of this preset's."""
        if spec.preset != self.name:
            raise TaskError(f"task is from preset {spec.preset!r}, not {self.name!r}")
        if spec.dataset not in self.levels:
            raise TaskError(f"dataset {spec.dataset!r} is not in preset {self.name!r}")
        try:
            return self.levels[spec.dataset].index(canonical_config(spec.config_dict()))
        except (ValueError, json.JSONDecodeError):
            raise TaskError(f"config for {spec.dataset!r} is outside preset {self.name!r}'s levels") from None


def preset_names() -> list[str]:
    folder = resources.files("swarmling.assets") / "presets"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


@lru_cache(maxsize=16)
def load_preset(name: str) -> Preset:
    if name not in preset_names():
        raise TaskError(f"unknown preset {name!r}; presets are: {', '.join(preset_names())}")
    data = tomllib.loads((resources.files("swarmling.assets") / "presets" / f"{name}.toml").read_text("utf-8"))
    from reasoning_gym.factory import DATASETS

    levels = {}
    for dataset, table in data["datasets"].items():
        if dataset in NONDETERMINISTIC:
            raise TaskError(f"preset {name}: {dataset} items differ between processes; peers could not agree")
        if dataset not in DATASETS:
            raise TaskError(f"preset {name}: reasoning-gym has no dataset {dataset!r}")
        levels[dataset] = tuple(canonical_config(c) for c in table["levels"])
    partial = frozenset(data.get("partial_credit", ()))
    if unknown := partial - set(levels):
        raise TaskError(f"preset {name}: partial_credit names datasets it does not have: {', '.join(sorted(unknown))}")
    return Preset(data["name"], data.get("description", ""), int(data.get("max_new_tokens", 128)), levels, partial)


@lru_cache(maxsize=4096)
def regenerate(spec: TaskSpec) -> Task:
    """The question and true answer for a spec, computed here (cached: specs are immutable)."""
    if spec.dataset in NONDETERMINISTIC:
        raise TaskError(f"{spec.dataset} is not reproducible across processes")
    if not (0 <= spec.index < 1_000_000 and 0 <= spec.seed < 2**31):
        raise TaskError("seed or index out of range")
    from reasoning_gym import create_dataset

    config = spec.config_dict()
    # Some generators (bf) print while they work; keep stdout clean for the headless log.
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            dataset = create_dataset(spec.dataset, seed=spec.seed, size=spec.index + 1, **config)
            entry = dataset[spec.index]
        except Exception as exc:  # bad config values from a spec: a clear refusal, not a crash
            raise TaskError(f"reasoning-gym could not build {spec.dataset} item: {exc}") from exc
    if not entry.get("question"):
        raise TaskError(f"{spec.dataset} produced an empty question for this spec")
    return Task(spec, entry["question"], dict(entry))

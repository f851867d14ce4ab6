"""A backend without a model, for pure-logic tests of the round, the node loop, pausing and intake.

It keeps the contract that matters to its callers (token ids for text, G completions per prompt
with one logprob per token, `should_stop` honoured between steps, `Abandoned` from training,
state saved and restored) and nothing else: what it writes is not meant to be right. Whether a
backend really samples and learns is tested on the real model (test_generation, test_training).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swarmling.app.config import load_config
from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
from swarmling.app.learning.round import RoundSettings
from swarmling.app.learning.tasks import TaskSpec, load_preset, regenerate
from swarmling.app.node.loop import Node
from swarmling.app.paths import resolve_paths
from swarmling.backends.base import (
    Abandoned,
    Backend,
    BackendInfo,
    ChatPrompt,
    Completion,
    GenerationResult,
    ProgressCallback,
    SamplingParams,
    StopCheck,
    TrainSample,
    TrainStats,
)

# Some replies close the tag and some do not, so groups carry a (format) learning signal.
REPLIES = ("4</answer>", "12</answer>", "7", "0</answer>", "maybe 3")


UNLIKELY_SURPRISE = 11.5


class FakeBackend(Backend):
    def __init__(self, step_seconds: float = 0.0) -> None:
        self.step_seconds = step_seconds  # a pause between decode steps, so tests can stop mid-round
        self.train_steps = 0
        self.handoffs = 0
        self.closed = False
        self._tick = threading.Event()  # never set: an interruptible sleep

    def info(self) -> BackendInfo:
        return BackendInfo("fake", "no model", "fake", 0, "fake", "fake")

    def tokenize(self, text: str) -> list[int]:
        return [ord(ch) % 997 for ch in text]

    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        return self.tokenize(f"{prompt.system}\n{prompt.user}\n{prompt.prefill}")

    def generate(
        self,
        prompts: Sequence[ChatPrompt],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        rng = np.random.default_rng(params.seed)
        total, done, tokens = len(prompts) * n, 0, 0
        completions: list[list[Completion]] = []
        for _ in prompts:
            group = []
            for _ in range(n):
                if self.step_seconds:
                    self._tick.wait(self.step_seconds)
                if should_stop is not None and should_stop():
                    group.append(Completion("", [], [], "abandoned"))
                    continue
                text = REPLIES[int(rng.integers(len(REPLIES)))][: params.max_new_tokens]  # a character a token
                ids = self.tokenize(text)
                finish = "stop" if "</answer>" in text else "length" if len(ids) == params.max_new_tokens else "eos"
                group.append(Completion(text, ids, [-0.5] * len(ids), finish))
                done, tokens = done + 1, tokens + len(ids)
                if on_progress is not None:
                    on_progress(done, total, tokens)
            completions.append(group)
        return GenerationResult(
            [self.encode_prompt(p) for p in prompts], completions, seconds=0.01,
            prefill_tokens=sum(len(self.encode_prompt(p)) for p in prompts), generated_tokens=tokens,
        )

    def train_step(
        self, samples: Sequence[TrainSample], should_stop: StopCheck | None = None, on_progress: ProgressCallback | None = None
    ) -> TrainStats:
        if should_stop is not None and should_stop():
            raise Abandoned("training abandoned")
        self.train_steps += 1
        tokens = sum(len(s.completion_ids) for s in samples)
        if on_progress is not None:
            on_progress(tokens, tokens, tokens)
        return TrainStats(loss=0.0, tokens=tokens, samples=len(samples), seconds=0.0, grad_norm=0.0,
                          clip_fraction=0.0, ratio_mean=1.0)

    def token_surprise(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        # The fake policy is surprised by nothing it writes itself; a character it never writes ("#"), much.
        return [[UNLIKELY_SURPRISE if t == self.tokenize("#")[0] else 0.0 for t in s.completion_ids] for s in samples]

    def hand_off(self) -> float:
        self.handoffs += 1
        return 0.0

    def save_state(self, directory: Path) -> None:
        self.save_adapter(directory)  # as every backend's: the adapter and the optimizer
        (directory / "fake_state.json").write_text(json.dumps({"train_steps": self.train_steps}))

    def load_state(self, directory: Path) -> None:
        self.train_steps = json.loads((directory / "fake_state.json").read_text())["train_steps"]

    def save_adapter(self, directory: Path) -> None:
        (directory / "fake_adapter.json").write_text("{}")

    def load_adapter(self, directory: Path) -> None:
        (directory / "fake_adapter.json").read_text()

    def close(self) -> None:
        self.closed = True


# ---- what tests of the round, the node and the swarm's pool build on ---------------------------

# Pure-logic tests of the round and the node train on every round with a signal (the minimum
# batch off), as every round did before it: their fake replies are rarely right.
SETTINGS = RoundSettings(questions=4, completions=4, max_new_tokens=12, temperature=1.0, local_groups=2,
                         external_groups=2, prefill_answer=True, format_bonus=0.5, min_signal_groups=0)

NODE_CLI = [("round.questions", 4), ("round.completions", 4), ("round.max_new_tokens", 12), ("round.external_groups", 2),
            ("run.seed", 3), ("swarm.enabled", False), ("resources.nice", 0), ("resources.check_every_s", 3600),
            ("resources.pause_on_battery", True), ("resources.resume_after_plugged_s", 0),
            ("train.min_signal_groups", 0), ("eval.every_rounds", 0)]


def make_node(home, events=None, step_seconds=0.0, **extra):
    """A real Node (config, checkpoints, loop) on FakeBackends; returns it and the backends it built."""
    built = []

    def build(spec):
        built.append(FakeBackend(step_seconds))
        return built[-1]

    config = load_config(None, environ={}, cli=[*NODE_CLI, *extra.items()])
    node = Node(config, resolve_paths(home), (events.append if events is not None else None), build=build)
    return node, built


def records(home) -> list[dict]:
    """The node's metrics log."""
    return [json.loads(line) for line in (home / "state" / "metrics.jsonl").read_text().splitlines()]


def group(rewards, source="local"):
    """A starter-preset group whose replies earned `rewards` (strict and shaped alike)."""
    t = regenerate(TaskSpec("starter", "chain_sum", load_preset("starter").levels["chain_sum"][0], 1, 1))
    comps = [ScoredCompletion("x", [1], None, "eos", r, True, r) for r in rewards]
    return QuestionGroup(t, 0, ChatPrompt("s", "u"), [1, 2], comps, source)


class ArithmeticBackend(FakeBackend):
    """Answers chain_sum questions ("... 6 + 2 =") right in `right` of every group's replies (the
    rest wrong), for the first `mixed` prompts of each call; the other prompts get only wrong
    replies: `mixed` groups with right and wrong replies per round. Records what it trained on."""

    def __init__(self, mixed: int, right: int = 1) -> None:
        super().__init__()
        self.mixed, self.right = mixed, right
        self.trained: list[list[TrainSample]] = []

    def generate(self, prompts, n, params, should_stop=None, on_progress=None) -> GenerationResult:
        import re

        completions = []
        for p, prompt in enumerate(prompts):
            answer = eval(re.search(r"([\d\s+-]+)=\s*$", prompt.user).group(1))  # digits, + and - only
            group = []
            for g in range(n):
                text = f"{answer if p < self.mixed and g < self.right else answer + 1}</answer>"
                ids = self.tokenize(text)
                group.append(Completion(text, ids, [-0.5] * len(ids), "stop"))
            completions.append(group)
        tokens = sum(len(c.token_ids) for group in completions for c in group)
        return GenerationResult([self.encode_prompt(p) for p in prompts], completions, seconds=0.01,
                                prefill_tokens=0, generated_tokens=tokens)

    def train_step(self, samples, should_stop=None, on_progress=None) -> TrainStats:
        self.trained.append(list(samples))
        return super().train_step(samples, should_stop, on_progress)


def node_state(round_no: int, model: str = "smollm2-135m") -> dict:
    """A checkpoint's node state as saved at `round_no` (the starter preset's fresh curriculum)."""
    import msgspec

    from swarmling.app.learning.curriculum import Curriculum
    from swarmling.app.node.resume import LEARNING_VERSION, NodeState

    return msgspec.to_builtins(NodeState(learning=LEARNING_VERSION, round=round_no, seed=3, model=model,
                                         curriculum=Curriculum(load_preset("starter")).to_dict(),
                                         metrics={"round": round_no}))


PEER = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"  # a well-formed peer ID, for groups from a peer


def intake_context(max_new_tokens: int = 8):
    """What the intake checks a peer's group against, on FakeBackend's tokenizer."""
    from swarmling.app.learning.prompt import PromptFormat
    from swarmling.app.swarm.verification.intake import IntakeContext

    return IntakeContext.for_sampler(FakeBackend(), "smollm2-135m", prompt=PromptFormat(), format_bonus=0.5,
                                     max_new_tokens=max_new_tokens, group_size=4)

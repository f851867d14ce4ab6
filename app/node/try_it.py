"""Trying a node's model: `swarmling ask QUESTION`, the TUI's try-it screen and the end of a run: the trained model and the base model
answer the same question side by side, asked as the node asks (its prompt, the pre-started
`<answer>`) and decoded as the evaluation decodes (near-greedy, a fixed seed), on the model's file
as shipped (the node's sampler may run an F16 copy of it: backend.sampler_weights).

A small copy of its own rather than the node's backend: llama.cpp alone on the base GGUF (no
torch trainer), with the checkpoint's adapter written as a GGUF LoRA into a temporary folder,
on one thread by default. So a running node's round is not paused or reordered, its backend's
memory is not touched, and the copy's own cost (tests/test_ask.py prints it) is small beside
the node's; swapping the adapter in and out between the two answers costs milliseconds.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...backends.chat_template import render
from ...backends.gguf_lora import peft_adapter_as_gguf
from ...backends.llama_cpp_generator import LlamaCppGenerator
from ..config import Config
from ..errors import NodeError
from ..learning.evaluation import near_greedy
from ..learning.prompt import PromptFormat
from ..learning.reward import RIGHT
from ..learning.tasks import load_preset
from ..models import resolve_model
from ..paths import Paths
from ..sizing import reply_tokens
from .checkpoint_choice import take_checkpoint


@dataclass(frozen=True)
class Answers:
    question: str
    trained: str  # the whole reply, the pre-started `<answer>` included
    base: str
    trained_round: int | None  # the round of the trained weights (None: no checkpoint yet, both are the base)
    seconds: float


class TryIt:
    """The base GGUF in llama.cpp, with a checkpoint's adapter to switch in for the trained answer."""

    def __init__(self, model_name: str, gguf: Path, prefill_answer: bool, max_new_tokens: int, threads: int = 1) -> None:
        self.model_name, self.gguf = model_name, gguf
        self.form = PromptFormat(prefill_answer)
        self.params = near_greedy(max_new_tokens)
        self.generator = LlamaCppGenerator(gguf, threads)
        self._folder = Path(tempfile.mkdtemp(prefix="swarmling-ask-"))
        self.adapter: Path | None = None
        self.trained_round: int | None = None

    @classmethod
    def for_node(cls, config: Config, paths: Paths, threads: int = 1) -> TryIt:
        model = resolve_model(config.model.name, paths.cache_dir)
        if model.gguf is None:
            raise NodeError(f"`ask` runs GGUF models in llama.cpp; {model.name} has none: "
                            "`swarmling export --format hf` gives a folder transformers can ask")
        return cls(model.name, model.gguf, config.reward.prefill_answer, reply_tokens(config, load_preset(config.round.preset)),
                   threads)

    def load(self, checkpoints: Path, folder: Path | None = None, best: bool = False) -> int:
        """Take the checkpoint's adapter (the newest, `folder` or the best); returns its round."""
        copy = self._folder / "checkpoint"
        try:
            taken = take_checkpoint(checkpoints, folder, best, self.model_name, copy)
            adapter = self._folder / f"adapter-{taken.round}.gguf"
            peft_adapter_as_gguf(copy, self.gguf, adapter)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        self.adapter, self.trained_round = adapter, taken.round
        return taken.round

    def _reply(self, question: str, adapter: Path | None) -> str:
        self.generator.set_adapter(adapter)
        ids = self.generator.tokenize_prompt(render(self.form.prompt(question), self.generator.chat_template))
        completion = self.generator.generate([ids], 1, self.params).completions[0][0]
        return self.form.whole_reply(completion.text)

    def ask(self, question: str) -> Answers:
        started = time.perf_counter()
        base = self._reply(question, None)
        trained = self._reply(question, self.adapter) if self.adapter is not None else base
        self.generator.release_context()  # its KV cache is not kept between questions
        return Answers(question, trained, base, self.trained_round, time.perf_counter() - started)

    def close(self) -> None:
        self.generator.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def format_answers(a: Answers) -> str:
    trained = f"trained (round {a.trained_round})" if a.trained_round is not None else "trained (no checkpoint yet)"
    width = max(len(trained), len("base model"))

    def row(label: str, reply: str) -> str:  # a reply's further lines under its first
        return f"{label:<{width}}  " + reply.replace("\n", "\n" + " " * (width + 2))

    return "\n".join([f"question: {a.question}", row(trained, a.trained), row("base model", a.base),
                      f"({a.seconds:.1f} s; the node's prompt, near-greedy decoding as in its evaluation)"])


def before_and_after(config: Config, paths: Paths, threads: int = 1) -> str | None:
    """What a finished run shows last: one held-out question (never trained on) answered by the
    base model and by the newest checkpoint, the one of the fixed set's first item per dataset where
    the trained model is right and the base is not, else where they differ, else the first; None
    where there is no checkpoint yet."""
    from ..learning.evaluation import eval_tasks

    preset = load_preset(config.round.preset)
    tasks = eval_tasks(preset.name)
    per = max(1, len(tasks) // len(preset.datasets))
    candidates = tasks[::per][: len(preset.datasets)]
    tryit = TryIt.for_node(config, paths, threads)
    try:
        try:
            tryit.load(paths.checkpoints)
        except NodeError:
            return None
        asked = [(task, tryit.ask(task.question)) for task in candidates]
    finally:
        tryit.close()
    form = tryit.form

    def right(task, reply: str) -> bool:
        return form.score(task, reply.removeprefix(form.prefill), 0.0).strict >= RIGHT

    task, answers = next((a for a in asked if right(a[0], a[1].trained) and not right(a[0], a[1].base)),
                         next((a for a in asked if a[1].trained != a[1].base), asked[0]))
    verdict = "; ".join(f"{who} {'right' if right(task, reply) else 'wrong'}"
                        for who, reply in (("trained", answers.trained), ("base", answers.base)))
    return (f"before and after, on a held-out question no round trained on (the answer: {task.entry['answer']}; "
            f"{verdict}):\n" + format_answers(answers))


class NodeAsker:
    """The TUI's try-it screen's answers: a TryIt on one thread, the newest checkpoint taken
    again for each question (the node moves on while the screen is open)."""

    def __init__(self, config: Config, paths: Paths) -> None:
        self.paths = paths
        self.tryit = TryIt.for_node(config, paths, threads=1)

    def __call__(self, question: str) -> Answers:
        try:
            self.tryit.load(self.paths.checkpoints)
        except NodeError:
            pass  # no checkpoint yet: the base model answers for both
        return self.tryit.ask(question)

    def close(self) -> None:
        self.tryit.close()

"""`swarmling ask QUESTION`: the trained model and the base model answer the same question side
by side (node/try_it.py says how: a small llama.cpp copy beside any running node)."""

from __future__ import annotations

from pathlib import Path

from ..config import Config
from ..errors import NodeError
from ..hardware import physical_cores
from ..node.try_it import TryIt, format_answers
from ..paths import Paths
from ..sizing import node_threads
from .arguments import Invocation, add_checkpoint_choice, add_config_flags


def ask_command(config: Config, paths: Paths, question: str, checkpoint: Path | None, best: bool) -> int:
    question = question.strip()
    if not question:
        raise NodeError("ask what? e.g. swarmling ask \"What is 17 + 25?\"")
    tryit = TryIt.for_node(config, paths, node_threads(config, physical_cores()))  # no GPU probe: llama.cpp runs on the CPU
    try:
        try:
            tryit.load(paths.checkpoints, checkpoint, best)
        except NodeError as exc:
            if checkpoint is not None or best:
                raise
            print(f"swarmling: {exc}; only the base model answers")
        answers = tryit.ask(question)
    finally:
        tryit.close()
    print(format_answers(answers))
    return 0


def ask_arguments(p) -> None:
    p.add_argument("question", help='e.g. "What is 17 + 25?"')
    add_checkpoint_choice(p)
    add_config_flags(p)


def ask_main(c: Invocation) -> int:
    return ask_command(c.config, c.paths, c.args.question, c.args.checkpoint, c.args.best)

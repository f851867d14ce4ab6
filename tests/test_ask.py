"""`swarmling ask`: the trained and the base model answer side by side, on the real shipped model."""

from __future__ import annotations

import psutil
import pytest
import torch
from fakes import node_state

from swarmling.app.cli import main
from swarmling.app.node.try_it import TryIt
from swarmling.app.node.checkpoint import save_checkpoint
from swarmling.app.paths import resolve_paths

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def home(tmp_path_factory, gguf_path, cpu_backend_maker):
    """A home whose round-3 checkpoint answers otherwise than the base model (random LoRA B)."""
    home = tmp_path_factory.mktemp("home")
    backend = cpu_backend_maker(gguf_path, home / "runtime", threads=1)
    try:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in backend.trainer.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        save_checkpoint(resolve_paths(home).checkpoints, 3, node_state(3), backend.save_state)
    finally:
        backend.close()
    return home


def test_ask_prints_both_answers(home, capsys):
    assert main(["--home", str(home), "ask", "What is 17 + 25?", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    assert lines[0] == "question: What is 17 + 25?"
    assert lines[1].startswith("trained (round 3)  <answer>")
    assert [line for line in lines if line.startswith("base model         <answer>")]
    assert all(line.startswith(("question:", "trained", "base model", " " * 19, "(")) for line in lines)


def test_the_try_it_copy_is_small_and_answers_with_the_adapter(home, gguf_path):
    process = psutil.Process()
    before = process.memory_info().rss
    tryit = TryIt("smollm2-135m", gguf_path, prefill_answer=True, max_new_tokens=48, threads=1)
    try:
        assert tryit.load(resolve_paths(home).checkpoints) == 3
        questions = ["What is 17 + 25?", "How many legs does a spider have?", "What is 9 - 4?", "What is 3 + 5 + 2?"]
        answers = [tryit.ask(q) for q in questions]
        grown = process.memory_info().rss - before
    finally:
        tryit.close()
    print(f"the try-it copy (llama.cpp, base GGUF + adapter, one question's context): +{grown / 1e6:.0f} MB resident")
    assert grown < 400e6  # beside a node's ~1.2-2.2 GB
    assert any(a.trained != a.base for a in answers)  # the adapter is in the trained answers


def test_a_finished_run_shows_one_held_out_question_before_and_after(home):
    from swarmling.app.node.try_it import before_and_after
    from swarmling.app.config import Config

    config = Config.model_validate({"round": {"preset": "starter"}})
    shown = before_and_after(config, resolve_paths(home))
    print(shown)
    lines = shown.splitlines()
    assert lines[0].startswith("before and after, on a held-out question no round trained on (the answer: ")
    assert lines[1].startswith("question: ") and lines[2].startswith("trained (round 3)  <answer>")
    assert before_and_after(config, resolve_paths(home / "empty")) is None  # no checkpoint yet: nothing to show

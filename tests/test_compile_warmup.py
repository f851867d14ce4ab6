"""The compiled trainer's graphs built off the critical path (backends/compile_warmup.py): eager fp32
steps while a replica compiles in the background, then compiled steps that build no graph of their
own, the trainer still its sampler's policy across the switch."""

from __future__ import annotations

import time

import numpy as np
import pytest

from swarmling.backends.torch_compile import CompiledLayers, graphs_compiled


class Built:
    """A background build that is done (or not yet), as compile_warmup.BackgroundCompile reports it."""

    def __init__(self, done: bool = True, failure: str = "") -> None:
        self.done, self.failure, self.seconds, self.graphs, self.waited = done, failure, 12.0, 3, False

    def wait(self) -> None:
        self.waited, self.done = True, True


def layers():
    import torch

    return [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]


def test_the_layers_compile_between_passes_once_the_background_build_is_done():
    compiling, events = CompiledLayers(layers(), lambda: None), []
    build = Built(done=False)
    compiling.build_in_background(build, lambda: events.append(("built", compiling.on)))
    assert compiling.run(lambda: compiling.on) is False and compiling.pending  # not done: eager
    build.done = True
    assert compiling.run(lambda: compiling.on) is True and not compiling.pending
    assert events == [("built", False)]  # what goes with it (a bf16 base) before the first compiled pass
    assert compiling.built_in_background == (12.0, 3)
    compiling.on = False


def test_a_choice_made_while_the_graphs_build_waits_for_them_and_holds():
    compiling = CompiledLayers(layers(), lambda: None)
    build = Built(done=False)
    compiling.build_in_background(build, lambda: None)
    compiling.on = False  # bench's eager pass: the build's end must not turn it back on later
    assert build.waited and not compiling.on and not compiling.pending
    assert compiling.run(lambda: compiling.on) is False


def test_a_background_build_that_failed_leaves_the_trainer_eager_and_says_why():
    compiling, built = CompiledLayers(layers(), lambda: None), []
    compiling.build_in_background(Built(failure="InductorError: no compiler"), lambda: built.append(1))
    assert compiling.run(lambda: compiling.on) is False
    assert compiling.failure == "InductorError: no compiler" and not built and not compiling.pending


@pytest.mark.slow  # compiles a replica (about a minute on 2 cores with a cold cache) and trains the real model
def test_a_fresh_node_trains_eagerly_while_its_graphs_build_then_compiled_without_building_any(
        cpu_backend_maker, gguf_path, tmp_path):
    from swarmling.backends.base import ChatPrompt, TrainSample

    backend = cpu_backend_maker(gguf_path, tmp_path / "run", compiler="/usr/bin/g++", compile_reason="compiled: g++")
    try:
        trainer = backend.trainer
        assert trainer.compiling.pending and not trainer.compiling.on and not trainer.bf16_base
        assert backend.switches().compiled  # what it will run with
        assert "building in the background" in backend.info().trainer
        prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
        samples = [TrainSample(prompt, backend.tokenize(reply), advantage) for reply, advantage in
                   (("8</answer>", 1.0), ("9</answer>", -1.0), ("The sum is 8.</answer>", 0.5), ("I think 7</answer>", -0.5))]
        eager_steps, started = [], time.monotonic()
        while trainer.compiling.pending and not trainer.compiling.built and time.monotonic() - started < 900:
            began = time.perf_counter()
            backend.train_step(samples)  # eager, fp32, beside the build
            eager_steps.append(time.perf_counter() - began)
            assert not trainer.compiling.proven
        assert trainer.compiling.built
        graphs = graphs_compiled()
        began = time.perf_counter()
        backend.train_step(samples)  # adopted: compiled, from the replica's graphs
        compiled_step = time.perf_counter() - began
        assert trainer.compiling.on and trainer.compiling.proven and not trainer.compiling.failure
        assert graphs_compiled() == graphs  # the real model built no graph of its own
        trainer.token_logprobs(samples)  # a pass without gradients: warmed too
        assert graphs_compiled() == graphs
        print(f"eager steps while building: {', '.join(f'{s:.2f}' for s in eager_steps)} s; built in "
              f"{trainer.compiling.built_in_background[0]:.0f} s; first compiled step {compiled_step:.2f} s")
        # Across the switch the trainer still computes its sampler's policy (as in
        # tests/test_trainer_is_the_sampler.py: ~0.05-0.08 nats a token apart on the Q4_1 file).
        backend.hand_off()
        policy = np.concatenate([np.asarray(lp) for lp in trainer.token_logprobs(samples)])
        sampler = []
        for sample in samples:
            logits = backend.generator.prompt_logits(list(sample.prompt_ids) + list(sample.completion_ids)).astype(np.float64)
            for j, token in enumerate(sample.completion_ids):
                row = logits[len(sample.prompt_ids) - 1 + j]
                sampler.append(row[token] - row.max() - np.log(np.exp(row - row.max()).sum()))
        assert float(np.abs(policy - np.asarray(sampler)).mean()) < 0.12
    finally:
        backend.trainer.compiling.adopt(wait=True)
        backend.close()

"""The trainer computes the policy its sampler samples from, after training too: the adapter's
updates reach the trainer's log-probabilities as they reach llama.cpp's.

Eager bf16 fails this: each adapted layer's output is rounded to bf16 with the adapter's update
added, and an update smaller than half a bf16 step of that output is lost, which early in
training is most of them. A node therefore trains in bf16 only compiled (inductor keeps the sum in
fp32 to the layer's end; app/sizing.cpu_bf16_choice). The start-up check (backends/bf16_check.py)
could not see it: it runs before any step, on an adapter that is still zero."""

from __future__ import annotations

import numpy as np
import pytest
from backend_settings import optim_settings

from swarmling.backends.base import ChatPrompt, TrainSample
from swarmling.backends.sampler_weights import SamplerWeightsError, f16_copy, file_type, sampler_weights
from swarmling.backends.settings import CpuSamplerChoice, CpuTrainerChoice


def sampler_gap(backend, samples) -> float:
    """Mean |log pi_trainer - log pi_sampler| per completion token, the adapter handed off."""
    backend.hand_off()
    trainer = np.concatenate([np.asarray(lp) for lp in backend.trainer.token_logprobs(samples)])
    sampler = []
    for sample in samples:
        logits = backend.generator.prompt_logits(list(sample.prompt_ids) + list(sample.completion_ids)).astype(np.float64)
        start = len(sample.prompt_ids) - 1  # the logits at position i predict token i + 1
        for j, token in enumerate(sample.completion_ids):
            row = logits[start + j]
            sampler.append(row[token] - row.max() - np.log(np.exp(row - row.max()).sum()))
    return float(np.abs(trainer - np.asarray(sampler)).mean())


@pytest.mark.slow  # compiles the trainer's layers (~1 min on 2 cores)
def test_after_training_the_trainer_is_its_samplers_policy_in_fp32_and_compiled_bf16_not_eager_bf16(
        backend_factory, tmp_path):
    # bf16 asked for, no compiler given: fp32. The step size pinned (the defaults may change): the
    # bigger the updates, the more of them survive bf16's rounding.
    backend = backend_factory(tmp_path / "run", cpu_trainer=CpuTrainerChoice(bf16=True), optim=optim_settings(learning_rate=3e-4, warmup_steps=5))
    assert not backend.trainer.bf16_base and "needs the compiled trainer" in backend.precision
    prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    samples = [TrainSample(prompt, backend.tokenize(reply), advantage) for reply, advantage in
               (("8</answer>", 1.0), ("9</answer>", -1.0), ("The sum is 8.</answer>", 0.5), ("I think 7</answer>", -0.5))]
    for _ in range(2):
        backend.train_step(samples)
    trainer = backend.trainer
    fp32 = sampler_gap(backend, samples)
    trainer.bf16_base = True
    eager_bf16 = sampler_gap(backend, samples)
    trainer.compiling.on = True
    try:
        compiled_bf16 = sampler_gap(backend, samples)
        assert not trainer.compiling.failure  # compiled, not an eager fallback
    finally:
        trainer.compiling.on = False
    print(f"trainer vs sampler after two steps, nats a token: fp32 {fp32:.3f}, bf16 eager {eager_bf16:.3f}, "
          f"bf16 compiled {compiled_bf16:.3f}")
    # The sampler reads the Q4_1 file: ~0.05-0.08 nats apart from any exact trainer (measured 0.079
    # fp32, 0.062 compiled bf16, 0.27 eager bf16).
    assert fp32 < 0.12 and compiled_bf16 < 0.12
    assert eager_bf16 > 2 * max(fp32, compiled_bf16)  # why a node never trains eager bf16


def test_an_f16_copy_of_the_shipped_file_samples_the_trainers_policy_and_is_made_once(backend_factory, tmp_path):
    """backends/sampler_weights.py: the shipped Q4_1 file's sampler sits ~0.05 nats a token from the
    fp32 trainer (llama.cpp quantizes activations inside quantized matmuls), an F16 copy's within
    a few thousandths; both after the same two steps, so the adapter's updates are in the gap too."""
    backends = {name: backend_factory(tmp_path / name, cpu_sampler=choice, optim=optim_settings(learning_rate=3e-4, warmup_steps=5))
                for name, choice in (("shipped", CpuSamplerChoice()), ("f16", CpuSamplerChoice(f16=True, reason="asked")))}
    shipped, f16 = backends["shipped"], backends["f16"]
    assert file_type(shipped.sampler_weights.path) == 3 and file_type(f16.sampler_weights.path) == 1
    assert "an F16 copy: asked" in f16.info().generator and "as shipped" in shipped.info().generator
    prompt = shipped.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    samples = [TrainSample(prompt, shipped.tokenize(reply), advantage) for reply, advantage in
               (("8</answer>", 1.0), ("9</answer>", -1.0), ("The sum is 8.</answer>", 0.5), ("I think 7</answer>", -0.5))]
    gaps = {}
    for name, backend in backends.items():
        for _ in range(2):
            backend.train_step(samples)
        gaps[name] = sampler_gap(backend, samples)
    print(f"trainer vs sampler after two steps, nats a token: {gaps}")
    assert gaps["f16"] < 0.01 and gaps["shipped"] > 3 * gaps["f16"]
    # Written once, into an empty cache here (the test cache holds one already): no partial file
    # left, and a second call finds it without writing.
    made = f16_copy(shipped.settings.gguf, tmp_path / "cache")
    assert file_type(made) == 1 and [f.name for f in made.parent.iterdir() if f.name.endswith(".tmp")] == []
    written = made.stat().st_mtime_ns
    assert f16_copy(shipped.settings.gguf, tmp_path / "cache") == made and made.stat().st_mtime_ns == written
    # An F16 file is sampled as it is.
    as_is = sampler_weights(made, tmp_path / "other", 1, CpuSamplerChoice(f16=True, f16_any=True, reason="asked"))
    assert as_is.path == made and "floating point already" in as_is.note


def test_a_copy_that_cannot_be_written_fails_where_asked_for_and_falls_back_under_auto(gguf_path, tmp_path, monkeypatch):
    """backends/sampler_weights.py: llama.cpp's quantizer failing (a full disk, say) leaves no
    file behind; backend.sampler_weights = "f16" refuses to start with what to change, "auto"
    samples the shipped file (the copy only makes sampling faster)."""
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_model_quantize", lambda *a: 1)
    with pytest.raises(SamplerWeightsError, match="sampler_weights = 'shipped'"):
        sampler_weights(gguf_path, tmp_path, 1, CpuSamplerChoice(f16=True, f16_any=True, reason="asked"))
    fallback = sampler_weights(gguf_path, tmp_path, 1, CpuSamplerChoice(f16=True, reason="auto"))
    assert fallback.path == gguf_path and "the F16 copy failed" in fallback.note
    assert [f.name for f in (tmp_path / "sampler-models").iterdir() if f.suffix in (".gguf", ".tmp")] == []

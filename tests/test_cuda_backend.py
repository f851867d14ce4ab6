"""The CUDA backend's code on the CPU (device="cpu", fp32): the real shipped model, real torch and
peft. GPU-only checks are skipped with a reason when no CUDA device is present."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from swarmling.app.learning.reward import CLOSE, OPEN
from swarmling.app.learning.prompt import SYSTEM_PROMPT
from swarmling.backends.base import ChatPrompt, SamplingParams, TrainSample
from swarmling.backends.cuda import BackendMemoryError, CudaBackend, CudaSettings, check_fits, round_memory_bytes

from backend_settings import trainer_settings

QUESTIONS = ["What is 2 + 3?", "How many legs does a spider have?", "Spell 'cat' backwards."]


@pytest.fixture(scope="module")
def torch_backend(hf_model):
    folder = hf_model
    return CudaBackend(CudaSettings(folder, "smollm2-135m", 1.0, device="cpu", seed=3, **trainer_settings()))


def prompts():
    return [ChatPrompt(SYSTEM_PROMPT, q, OPEN) for q in QUESTIONS]


def samples_from(result):
    return [TrainSample(result.prompt_ids[p], c.token_ids, 1.0 if i % 2 else -1.0, c.logprobs)
            for p, row in enumerate(result.completions) for i, c in enumerate(row) if c.token_ids]


def test_sampled_logprobs_agree_with_the_training_forward(torch_backend):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop=(CLOSE,), seed=5)
    result = torch_backend.generate(prompts(), 4, params)
    assert [len(row) for row in result.completions] == [4, 4, 4]
    samples = samples_from(result)
    recomputed = torch_backend.trainer.token_logprobs(samples)
    gap = max(abs(a - b) for r, s in zip(recomputed, samples) for a, b in zip(r, s.behaviour_logprobs))
    assert gap < 1e-3, gap  # one copy of the weights: only cached-decode vs full-forward rounding differs
    for row in result.completions:
        for c in row:
            assert len(c.token_ids) == len(c.logprobs) <= 24
            assert all(lp <= 0 for lp in c.logprobs)
            if c.finish_reason == "stop":
                assert c.text.endswith(CLOSE) and c.text.count(CLOSE) == 1  # cut at the stop string
            assert c.finish_reason in ("stop", "eos", "length")


def test_same_seed_same_completions_and_abandon(torch_backend):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop=(CLOSE,), seed=11)
    a = torch_backend.generate(prompts()[:1], 3, params)
    b = torch_backend.generate(prompts()[:1], 3, params)
    assert [c.token_ids for c in a.completions[0]] == [c.token_ids for c in b.completions[0]]
    stopped = torch_backend.generate(prompts()[:1], 2, params, should_stop=lambda: True)
    assert {c.finish_reason for c in stopped.completions[0]} == {"abandoned"}


def test_training_changes_what_is_sampled_with_no_hand_off_copy(torch_backend, tmp_path):
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop=(CLOSE,), seed=2)
    result = torch_backend.generate(prompts(), 4, params)
    samples = samples_from(result)
    before = torch_backend.trainer.token_logprobs(samples)
    progress = []
    stats = torch_backend.train_step(samples, on_progress=lambda d, t, _: progress.append((d, t)))
    assert stats.sampler_logprob_gap < 1e-3 and progress[-1][0] == progress[-1][1]
    assert torch_backend.hand_off() < 0.1  # the sampler is the trainer's model
    after = torch_backend.trainer.token_logprobs(samples)
    assert any(abs(x - y) > 1e-4 for r0, r1 in zip(before, after) for x, y in zip(r0, r1))
    # a checkpoint round trip restores exactly the policy that samples
    torch_backend.save_state(tmp_path)
    torch_backend.train_step(samples)
    torch_backend.load_state(tmp_path)
    restored = torch_backend.trainer.token_logprobs(samples)
    assert max(abs(x - y) for r0, r1 in zip(after, restored) for x, y in zip(r0, r1)) < 1e-5


def test_with_activation_checkpointing_the_sampler_still_is_the_policy_it_trains(torch_backend):
    """Checkpointing is switched on the model that also samples here: sampling (eval mode, no
    grad, compiled step on a GPU) must not notice, and a step under it still moves the policy."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop=(CLOSE,), seed=4)
    torch_backend.set_switches(replace(torch_backend.switches(), activation_checkpointing=True))
    try:
        result = torch_backend.generate(prompts(), 2, params)
        samples = samples_from(result)
        recomputed = torch_backend.trainer.token_logprobs(samples)
        assert max(abs(a - b) for r, s in zip(recomputed, samples) for a, b in zip(r, s.behaviour_logprobs)) < 1e-3
        stats = torch_backend.train_step(samples)
        assert stats.grad_norm > 0 and "activation checkpointing" in torch_backend.info().trainer
    finally:
        torch_backend.set_switches(replace(torch_backend.switches(), activation_checkpointing=False))


def test_round_memory_estimate_and_refusal(torch_backend, monkeypatch):
    cfg = torch_backend.trainer.config
    small = round_memory_bytes(cfg, 72, 406, 2)
    assert small == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) \
        * 72 * 406 * 2 + 72 * cfg.vocab_size * 12
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 8 * 2**30))
    with pytest.raises(BackendMemoryError, match="lower round.questions"):
        check_fits(cfg, 4096, 4096, "cuda", torch.bfloat16)
    check_fits(cfg, 4096, 4096, "cpu", torch.float32)  # no device memory to check on the CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_bf16_sampling_matches_training(hf_model):
    backend = CudaBackend(CudaSettings(hf_model, "smollm2-135m", 1.0, device="cuda",
                                       **trainer_settings()))
    result = backend.generate(prompts(), 8, SamplingParams(max_new_tokens=32, temperature=1.0, stop=(CLOSE,), seed=1))
    stats = backend.train_step(samples_from(result))
    assert stats.sampler_logprob_gap < 0.05 and stats.sampler_ratio_outside < 0.05


def test_a_failing_compiled_step_falls_back_to_eager(torch_backend, caplog):
    gen = torch_backend.generator
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=4)
    eager = gen.generate([torch_backend.encode_prompt(prompts()[0])], 2, params)

    def broken(*args):
        raise RuntimeError("inductor could not compile")

    gen._compiled = broken
    assert gen.decoding == "compiled (CUDA graphs)"
    try:
        again = gen.generate([torch_backend.encode_prompt(prompts()[0])], 2, params)
        fell_back = gen.decoding  # what bench-gpu prints
    finally:
        gen._compiled, gen.compile_failure = None, ""
    assert [c.token_ids for c in again.completions[0]] == [c.token_ids for c in eager.completions[0]]
    assert "decoding eagerly" in caplog.text
    assert fell_back == "eager (RuntimeError: inductor could not compile)"


def test_asking_for_cuda_without_a_device_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = subprocess.run([sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "run", "--headless",
                          "--rounds", "1", "--set", "backend.kind=\"cuda\""], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "sees no CUDA device" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_gpu_benchmark_command_runs_its_toy_shape_on_the_cpu():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "swarmling.app", "bench-gpu", "--device", "cpu", "--tiny", "--rounds", "1"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for row in ("SmolLM2-135M", "Qwen2.5-0.5B", "generate, steady", "floor: generation", "HF generate static cache, steady",
                "round total, steady", "logprob gap", "train, each completion alone", "attention: sdpa"):
        assert row in out.stdout, row
    assert "MATH FALLBACK" not in out.stdout  # on the CPU too, the mask takes a fused kernel


@pytest.mark.slow
def test_full_fine_tuning_trains_every_weight_and_round_trips(hf_model, tmp_path):
    folder = hf_model
    full = CudaBackend(CudaSettings(folder, "smollm2-135m", 1.0, device="cpu", seed=3, full=True, **trainer_settings()))
    assert full.trainer.trainable_parameters() > 100e6  # all ~135M, not an adapter's ~5M
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop=(CLOSE,), seed=6)
    result = full.generate(prompts()[:2], 2, params)
    samples = samples_from(result)
    before = full.trainer.token_logprobs(samples)
    stats = full.train_step(samples)
    assert stats.sampler_logprob_gap < 1e-3
    after = full.trainer.token_logprobs(samples)
    assert any(abs(x - y) > 1e-4 for r0, r1 in zip(before, after) for x, y in zip(r0, r1))
    # the KL anchor's reference is the base as it was, output head (tied to the trained embeddings) included
    reference = [r.tolist() for r in full.trainer._reference_logprobs(samples)]
    assert max(abs(x - y) for r0, r1 in zip(before, reference) for x, y in zip(r0, r1)) < 1e-5
    full.save_state(tmp_path)
    full.train_step(samples)
    full.load_state(tmp_path)
    restored = full.trainer.token_logprobs(samples)
    assert max(abs(x - y) for r0, r1 in zip(after, restored) for x, y in zip(r0, r1)) < 1e-5
    lora = CudaBackend(CudaSettings(folder, "smollm2-135m", 1.0, device="cpu", **trainer_settings()))
    with pytest.raises(ValueError, match="train.mode"):
        lora.load_state(tmp_path)  # a full checkpoint is not silently read as an adapter


def test_a_whole_round_runs_on_the_torch_backend(torch_backend):
    from swarmling.app.learning.curriculum import Curriculum
    from swarmling.app.learning.draws import RoundDraws
    from swarmling.app.learning.round import RoundSettings, run_round
    from swarmling.app.learning.tasks import load_preset

    preset = load_preset("starter")
    phases, progress = [], []
    settings = RoundSettings(questions=3, completions=4, max_new_tokens=12, temperature=1.0, local_groups=3,
                             external_groups=0, prefill_answer=True, format_bonus=0.5)
    outcome = run_round(1, torch_backend, preset, Curriculum(preset), settings, RoundDraws(0, 1),
                        on_phase=phases.append, on_progress=lambda *a: progress.append(a))
    m = outcome.record.to_dict()
    assert m["questions"] == 3 and m["completions"] == 12 and m["generated_tokens"] > 0
    assert phases[:3] == ["tasks", "generate", "score"]
    assert any(p[0] == "generate" for p in progress)
    if "train" in m:  # a round with signal trained: sampling and training agree on the same weights
        assert m["train"]["sampler_logprob_gap"] < 1e-3
        assert m["seconds"]["hand-off"] < 0.1

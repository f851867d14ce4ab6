"""The MLX backend's real code path on Linux (mlx[cpu]): the shipped model, tiny shapes.
Skipped with the reason where mlx cannot be installed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="mlx is not installable here (pip install 'mlx[cpu]' on Linux)")

from backend_settings import trainer_settings  # noqa: E402

from swarmling.app.learning.reward import CLOSE, OPEN  # noqa: E402
from swarmling.backends.base import ChatPrompt, SamplingParams, TrainSample  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlx_backend(hf_model):
    from swarmling.backends.mlx import MlxBackend, MlxSettings

    return MlxBackend(MlxSettings(hf_model, "smollm2-135m", 1.0, seed=1, **trainer_settings()))


def prompts():
    # A short prompt (23 tokens, the node's is 51): mlx's CPU build on Linux multiplies matrices
    # ~35x slower than numpy's BLAS (about 1.5 GFLOP/s here), so these tests pay per token.
    return [ChatPrompt("Answer.", "2+3?", OPEN)]


def samples_from(result):
    return [TrainSample(result.prompt_ids[p], c.token_ids, 1.0 if i % 2 else -1.0, c.logprobs)
            for p, row in enumerate(result.completions) for i, c in enumerate(row) if c.token_ids]


def test_generation_logprobs_agree_with_the_training_forward(mlx_backend):
    result = mlx_backend.generate(prompts(), 2, SamplingParams(max_new_tokens=5, temperature=1.0, stop=(CLOSE,), seed=3))
    assert len(result.completions[0]) == 2
    for c in result.completions[0]:
        assert 1 <= len(c.token_ids) == len(c.logprobs) <= 5 and all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in ("eos", "stop", "length")
    samples = samples_from(result)
    recomputed = mlx_backend.token_logprobs(samples)
    gap = max(abs(a - b) for r, s in zip(recomputed, samples) for a, b in zip(r, s.behaviour_logprobs))
    assert gap < 1e-3, gap


def test_surprise_is_the_surprisal_beyond_the_policys_entropy_on_mlx(mlx_backend):
    """token_surprise (learning/screening.py) as the torch trainer's: -log pi - surprise = H, between
    0 and log(vocabulary), and an entropy, not a copy of the surprisal."""
    import math

    result = mlx_backend.generate(prompts(), 2, SamplingParams(max_new_tokens=5, temperature=1.0, stop=(CLOSE,), seed=4))
    samples = samples_from(result)
    logprobs, surprise = mlx_backend.token_logprobs(samples), mlx_backend.token_surprise(samples)
    entropies = [-lp - s for lps, ss in zip(logprobs, surprise) for lp, s in zip(lps, ss)]
    assert entropies and all(-1e-3 <= h <= math.log(150_000) for h in entropies)
    assert max(entropies) > 0.1


def test_a_lora_step_and_the_adapter_moves_to_torch_and_back(mlx_backend, tmp_path):
    from swarmling.backends.torch_lora import TorchLoraTrainer

    result = mlx_backend.generate(prompts(), 2, SamplingParams(max_new_tokens=4, temperature=1.0, seed=5))
    samples = samples_from(result)
    trainer = TorchLoraTrainer(mlx_backend.settings.model_dir, **trainer_settings(), temperature=1.0)
    # the same weights are the same model in both frameworks (this caught mlx-lm ignoring
    # transformers 5's rope_parameters: up to 0.96 nats apart before the fix)
    base_gap = max(abs(a - b) for r0, r1 in zip(mlx_backend.token_logprobs(samples), trainer.token_logprobs(samples))
                   for a, b in zip(r0, r1))
    assert base_gap < 2e-3, base_gap
    stats = mlx_backend.train_step(samples)
    assert np.isfinite(stats.loss) and stats.grad_norm > 0 and stats.sampler_logprob_gap < 1e-3
    after = mlx_backend.token_logprobs(samples)
    mlx_backend.save_state(tmp_path)

    # the same adapter in the torch trainer gives the same policy: the checkpoint format is portable
    trainer.load_adapter(tmp_path)
    torch_lp = trainer.token_logprobs(samples)
    diff = max(abs(a - b) for r0, r1 in zip(after, torch_lp) for a, b in zip(r0, r1))
    assert diff < 2e-3, diff  # two frameworks, fp32 both: summation order only

    # and back: a further step, then the saved state restores exactly
    mlx_backend.train_step(samples)
    mlx_backend.load_state(tmp_path)
    restored = mlx_backend.token_logprobs(samples)
    assert max(abs(a - b) for r0, r1 in zip(after, restored) for a, b in zip(r0, r1)) < 1e-5


def test_shared_prefix_matches_each_completion_trained_alone(mlx_backend):
    """MLX's shared prefix (one prompt pass whose keys/values the group's completions attend to):
    the same per-token logprobs and LoRA gradient as each sequence alone, on completions of
    different lengths (one of a single token) and a group of one. fp32; summation order only,
    as in the torch test (tests/test_shared_prefix.py)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from swarmling.backends.mlx_passes import logprobs
    from swarmling.backends.shared_prefix import packed_rows

    rng = np.random.default_rng(4)
    first, second = rng.integers(100, 40000, 30).tolist(), rng.integers(100, 40000, 17).tolist()
    samples = [TrainSample(first, rng.integers(100, 40000, n).tolist(), 1.0) for n in (1, 7, 4)]
    samples.append(TrainSample(second, rng.integers(100, 40000, 5).tolist(), 1.0))
    weights = [rng.normal(size=len(s.completion_ids)).astype(np.float32) for s in samples]

    def run(shared):
        rows = [r for mb in packed_rows(samples, 4096, shared) for r in mb]
        order = [i for r in rows for i in r.samples]
        aligned = mx.array(np.concatenate([weights[j] for j in order]))  # the tokens come in row order

        def loss(model):
            return (logprobs(model, samples, rows, 1.0) * aligned).sum()
        value, grads = nn.value_and_grad(mlx_backend.model, loss)(mlx_backend.model)
        lp = np.array(logprobs(mlx_backend.model, samples, rows, 1.0))
        per_sample, i = {}, 0
        for j in order:
            per_sample[j] = lp[i : i + len(samples[j].completion_ids)]
            i += len(samples[j].completion_ids)
        return per_sample, np.concatenate([np.array(v).ravel() for _, v in sorted(tree_flatten(grads))])

    shared_lp, shared_grad = run(True)
    alone_lp, alone_grad = run(False)
    assert max(float(np.abs(shared_lp[j] - alone_lp[j]).max()) for j in alone_lp) < 1e-4
    assert np.linalg.norm(shared_grad - alone_grad) <= 5e-5 * np.linalg.norm(alone_grad) + 1e-9


def test_apple_silicon_picks_mlx_and_says_why():
    from swarmling.app.hardware import Hardware, choose_backend

    mac = dict(system="Darwin 24", machine="arm64", cpu="Apple M2", physical_cores=8, logical_cores=8,
               memory_total=16 * 2**30, memory_available=8 * 2**30, apple_silicon=True)
    chosen = choose_backend(Hardware(**mac, mlx_importable=True))
    assert chosen.name == "mlx" and "unified memory" in chosen.reason
    fallback = choose_backend(Hardware(**mac, mlx_importable=False))
    assert fallback.name == "cpu" and "swarmling[mlx]" in fallback.reason


def test_a_node_runs_rounds_on_mlx_and_resumes(tmp_path):
    import json
    import subprocess
    import sys

    args = [sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "run", "--headless", "--rounds", "1",
            "--set", "backend.kind=\"mlx\"", "--set", "round.questions=1", "--set", "round.completions=2",
            "--set", "round.max_new_tokens=4", "--set", "run.seed=2"]
    for _ in range(2):  # the second run resumes from the first one's checkpoint
        out = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(x) for x in (tmp_path / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2] and {r["backend"] for r in records} == {"mlx"}


def test_mlx_weights_a_peers_completion_as_torch_does(mlx_backend, tmp_path):
    """train.external_importance_cap: the same peer completions (same tokens, same sender logprob)
    get the same sequence-level weight min(exp(sum old logp - sender logp), cap) in both trainers,
    so the same loss and gradient."""
    from dataclasses import replace

    from backend_settings import grpo_settings, lora_settings, optim_settings

    from swarmling.backends.torch_lora import TorchLoraTrainer

    result = mlx_backend.generate(prompts(), 2, SamplingParams(max_new_tokens=4, temperature=1.0, seed=7))
    row = [c for c in result.completions[0] if c.token_ids]
    own = mlx_backend.token_logprobs([TrainSample(result.prompt_ids[0], c.token_ids, 0.0) for c in row])
    # Peers' text (no per-token sampler logprobs): the first sender found it less likely than we do
    # by 0.7 nats (weight e^-0.7), the second far more unlikely (weight capped at 2).
    senders = [sum(own[0]) + 0.7, sum(own[-1]) - 5.0]
    samples = [TrainSample(result.prompt_ids[0], row[0].token_ids, 1.0, sequence_behaviour_logprob=senders[0]),
               TrainSample(result.prompt_ids[0], row[-1].token_ids, -1.0, sequence_behaviour_logprob=senders[1])]
    # the importance cap on its own: no extra weight on peers' negatives, no anchor (tested apart)
    grpo = grpo_settings(external_importance_cap=2.0, external_negative_cap=0.0, kl_beta=0.0)
    n0, n1 = len(samples[0].completion_ids), len(samples[1].completion_ids)
    expected_loss = -(np.exp(-0.7) * n0 - 2.0 * n1) / (n0 + n1)  # ratio 1: the loss is -mean(A * weight)

    mlx_backend.save_adapter(tmp_path)  # both trainers start from the same policy
    trainer = TorchLoraTrainer(mlx_backend.settings.model_dir, lora_settings(), optim_settings(), grpo, 1.0)
    trainer.load_adapter(tmp_path)
    torch_stats = trainer.train_step(samples)
    saved = mlx_backend.settings
    mlx_backend.settings = replace(saved, grpo=grpo)
    try:
        mlx_stats = mlx_backend.train_step(samples)
    finally:
        mlx_backend.settings = saved
    assert torch_stats.loss == pytest.approx(expected_loss, rel=1e-2)
    assert mlx_stats.loss == pytest.approx(torch_stats.loss, rel=1e-3, abs=1e-4)
    assert mlx_stats.grad_norm == pytest.approx(torch_stats.grad_norm, rel=1e-2)


def test_mlx_anchors_on_its_own_replies_as_torch_does(mlx_backend, tmp_path):
    """The KL anchor over own replies only (a peer's reply in the batch changes neither the KL
    reported nor its scale): both trainers, from the same adapter, agree with each other and with
    the k3 mean over the own replies' tokens computed by hand."""
    from backend_settings import grpo_settings, lora_settings, optim_settings

    from swarmling.backends.torch_lora import TorchLoraTrainer

    result = mlx_backend.generate(prompts(), 2, SamplingParams(max_new_tokens=4, temperature=1.0, seed=11))
    row = [c for c in result.completions[0] if c.token_ids]
    own = [TrainSample(result.prompt_ids[0], c.token_ids, 1.0 if i % 2 else -1.0) for i, c in enumerate(row)]
    mlx_backend.train_step(own)  # the policy away from the base
    peer = TrainSample(result.prompt_ids[0], row[0].token_ids[::-1], 1.0, sequence_behaviour_logprob=-30.0,
                       from_peer=True)
    mlx_backend.save_adapter(tmp_path)
    trainer = TorchLoraTrainer(mlx_backend.settings.model_dir, lora_settings(), optim_settings(), grpo_settings(), 1.0)
    trainer.load_adapter(tmp_path)
    policy = trainer.token_logprobs(own)
    with trainer.model.disable_adapter():
        base = trainer.token_logprobs(own)
    by_hand = np.mean([np.exp(b - p) - (b - p) - 1 for ps, bs in zip(policy, base) for p, b in zip(ps, bs)])
    torch_stats = trainer.train_step([*own, peer])
    mlx_stats = mlx_backend.train_step([*own, peer])
    assert by_hand > 1e-6 and torch_stats.kl == pytest.approx(by_hand, rel=1e-3)
    assert mlx_stats.kl == pytest.approx(torch_stats.kl, rel=5e-2, abs=1e-5)
    assert mlx_stats.loss == pytest.approx(torch_stats.loss, rel=1e-2, abs=1e-4)


def test_the_mlx_backend_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, swarmling.backends.mlx, swarmling.backends.factory; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

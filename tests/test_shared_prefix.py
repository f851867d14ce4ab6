"""Shared-prefix training: the layout (framework-free) and its equivalence with training each
completion as its own sequence, on the real shipped model."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.backends.base import TrainSample
from swarmling.backends.shared_prefix import (
    PADDING,
    PROMPT,
    attention_allowed,
    layout,
    microbatches,
    shared_rows,
)


def sample(prompt, completion) -> TrainSample:
    return TrainSample(list(prompt), list(completion), 1.0)


def test_a_group_becomes_one_row_with_positions_restarting_after_the_prompt():
    samples = [sample([1, 2, 3], [10, 11, 12]), sample([7, 7], [20]), sample([1, 2, 3], [13, 14])]
    rows = shared_rows(samples, token_budget=100)
    assert [r.samples for r in rows] == [(0, 2), (1,)]
    rb = layout(samples, rows)
    # prompt, completion 0 without its last token, completion 2 without its last token
    assert rb.input_ids[0].tolist() == [1, 2, 3, 10, 11, 13]
    assert rb.positions[0].tolist() == [0, 1, 2, 3, 4, 3]
    assert rb.segments[0].tolist() == [PROMPT] * 3 + [1, 1, 2]
    # a one-token completion adds no input: only its prompt, then padding
    assert rb.input_ids[1].tolist()[:2] == [7, 7] and rb.segments[1].tolist()[2:] == [PADDING] * 4
    width = rb.input_ids.shape[1]
    # each first token is scored at the prompt's last position, the next ones at their predecessor
    assert rb.scored.tolist() == [2, 3, 4, 2, 5, width + 1]
    assert rb.targets.tolist() == [10, 11, 12, 13, 14, 20] and rb.samples == [0, 2, 1]
    assert rb.owner.tolist() == [0, 0, 0, 1, 1, 2]


def test_a_completion_sees_the_prompt_and_itself_only():
    allowed = attention_allowed(np.array([[PROMPT, PROMPT, 1, 1, 2, PADDING]]))[0]
    assert allowed[1].tolist() == [True, True, False, False, False, False]  # prompt: causal
    assert allowed[3].tolist() == [True, True, True, True, False, False]  # completion 1
    assert allowed[4].tolist() == [True, True, False, False, True, False]  # completion 2 skips 1
    assert allowed[5].tolist() == [False] * 5 + [True]  # padding: itself, so no empty softmax row


def test_a_group_over_the_budget_is_split_into_rows_that_repeat_the_prompt():
    samples = [sample([1] * 10, [2] * 6) for _ in range(4)]  # 10 + 5 input positions each
    rows = shared_rows(samples, token_budget=19)
    assert [r.samples for r in rows] == [(0,), (1,), (2,), (3,)]
    assert [r.samples for r in shared_rows(samples, token_budget=20 + 5)] == [(0, 1, 2), (3,)]
    assert [rb.samples for rb in microbatches(samples, 1000)] == [[0, 1, 2, 3]]
    assert [rb.computed_tokens for rb in microbatches(samples, 1000, shared=False)] == [4 * 15]


# ---- on the real model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trainer(hf_model):
    import torch
    from backend_settings import grpo_settings, lora_settings, optim_settings

    from swarmling.backends.torch_lora import TorchLoraTrainer

    t = TorchLoraTrainer(hf_model, lora_settings(), optim_settings(), grpo_settings(), 0.7)
    # A fresh adapter's B is zero, which would leave A's gradient zero: give both some weight.
    g = torch.Generator().manual_seed(0)
    for p in t.params:
        p.data = torch.randn(p.shape, generator=g) * 0.02
    return t


def batch() -> list[TrainSample]:
    rng = np.random.default_rng(3)
    first, second = rng.integers(100, 40000, 40).tolist(), rng.integers(100, 40000, 23).tolist()
    # completions of different lengths (one token, so scored at the prompt alone), and a group of one
    return [sample(first, rng.integers(100, 40000, n).tolist()) for n in (1, 6, 13, 3)] + [
        sample(second, rng.integers(100, 40000, 9).tolist())
    ]


def reference_logprobs(trainer, samples):
    """Each completion as its own sequence through the unmodified model (its default causal
    mask, default positions): the computation shared prefixes must reproduce."""
    import torch

    out = []
    for s in samples:
        logits = trainer.causal_lm(input_ids=torch.tensor([s.prompt_ids + s.completion_ids])).logits[0].float()
        p = len(s.prompt_ids)
        scaled = logits[p - 1 : p - 1 + len(s.completion_ids)] / trainer.temperature
        out.append(torch.log_softmax(scaled, -1).gather(-1, torch.tensor(s.completion_ids)[:, None])[:, 0])
    return out


def trainer_logprobs(trainer, samples, budget, mask=True):
    import torch

    out = [None] * len(samples)
    for rb in microbatches(samples, budget):
        mb = trainer._tensors(rb)
        if not mask:  # the negative control: plain causal attention, completions see their siblings
            width = mb.attention_mask.shape[-1]
            mb.attention_mask = torch.ones(width, width, dtype=torch.bool).tril()[None, None]
        lp = trainer._logprobs(mb)
        for local, i in enumerate(mb.samples):
            out[i] = lp[mb.sample_index == local]
    return out


def logprobs_and_gradient(trainer, compute, weights):
    """Per-token logprobs and the LoRA gradient of a weighted sum of them (a stand-in for the GRPO
    loss, whose gradient is the logprobs' times per-token coefficients)."""
    import torch

    for p in trainer.params:
        p.grad = None
    logprobs = compute()
    sum(torch.dot(lp, w) for lp, w in zip(logprobs, weights)).backward()
    return [lp.detach() for lp in logprobs], torch.cat([p.grad.flatten() for p in trainer.params])


@pytest.mark.slow  # loads the model through its own fixture
def test_shared_prefix_logprobs_and_lora_gradient_match_each_completion_trained_alone(trainer):
    """fp32 throughout. The two computations differ only in summation order (other matmul shapes,
    SDPA with a mask vs without, gradients into the prompt summed inside one matmul instead of
    across sequences), each rounding step relative 6e-8, grown over 30 layers: measured ≈ 1e-5
    nats on logprobs of magnitude ~10 and ≈ 5e-6 relative on the gradient. The tolerances sit a
    few times above that; a real layout error (a completion seeing its siblings) is off by far
    more, as the negative control shows."""
    import torch

    samples = batch()
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(len(s.completion_ids), generator=g) for s in samples]
    ref_lp, ref_grad = logprobs_and_gradient(trainer, lambda: reference_logprobs(trainer, samples), weights)
    # one microbatch of two padded rows; then a budget that splits the big group into several rows
    for budget in (4096, 60):
        lp, grad = logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, budget), weights)
        assert max(float((a - b).abs().max()) for a, b in zip(ref_lp, lp)) < 1e-4, budget
        assert float((grad - ref_grad).norm() / ref_grad.norm()) < 5e-5, budget
    leaky = trainer_logprobs(trainer, samples, 4096, mask=False)
    assert max(float((a - b.detach()).abs().max()) for a, b in zip(ref_lp, leaky)) > 0.1


@pytest.mark.slow  # loads the model through its own fixture
def test_a_bf16_base_stays_close_to_fp32_and_leaves_the_trained_weights_fp32(trainer):
    """`bf16_base` (train.cpu_bf16) casts the frozen base to bf16 once: 8 significant bits instead
    of 24, so per-token logprobs move (a few hundredths of a nat on average) and the LoRA gradient
    keeps its direction; the head, the LoRA weights and their gradients stay fp32.
    The difference must also be non-zero (otherwise the bf16 path did not run), and switching back
    gives the fp32 logprobs exactly (the base is reloaded, not cast back)."""
    import torch

    samples = batch()
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(len(s.completion_ids), generator=g) for s in samples]
    fp32_lp, fp32_grad = logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, 4096), weights)
    trainer.bf16_base = True
    try:
        assert all(p.dtype == torch.bfloat16 for n, p in trainer.causal_lm.named_parameters() if not p.requires_grad)
        lp, grad = logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, 4096), weights)
    finally:
        trainer.bf16_base = False
    from swarmling.backends.bf16_check import MAX_NATS, MEAN_NATS

    differences = torch.cat([(a - b).abs() for a, b in zip(fp32_lp, lp)])
    mean, err = float(differences.mean()), float(differences.max())
    cosine = float(torch.dot(grad, fp32_grad) / (grad.norm() * fp32_grad.norm()))
    print(f"bf16 base vs fp32: logprob difference mean {mean:.4f}, max {err:.4f} nats, gradient cosine {cosine:.5f}")
    # Random tokens (logprobs ~ -10) move more than the start-up check's real replies (mean 0.02-0.05).
    # Measured on this batch: mean 0.084 nats both with the LoRA branch in fp32 (max 0.35) and in
    # bf16 with fp32 attention (max 0.51).
    assert 1e-4 < mean <= MEAN_NATS and err <= MAX_NATS and cosine >= 0.99
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trainer.params)
    back, _ = logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, 4096), weights)
    assert max(float((a - b).abs().max()) for a, b in zip(fp32_lp, back)) == 0.0


@pytest.mark.slow  # loads the model through its own fixture; compiles its layers (~1 min on 2 cores)
def test_compiled_layers_compute_what_eager_ones_do(trainer):
    """`compiling` (train.cpu_compile) runs each layer through torch.compile: the generated code
    fuses and reorders the elementwise work, so results move by rounding only (fp32: ~1e-6 nats).
    Two budgets give two batch shapes, which the dynamic graphs take without a new one each."""
    import torch
    from torch._dynamo.utils import counters

    samples = batch()
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(len(s.completion_ids), generator=g) for s in samples]
    eager = {b: logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, b), weights) for b in (4096, 60)}
    # Graphs are shared by every model of the class in the process (a node's background build made
    # some already): start from none, so that the compiled path must build its own.
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    trainer.compiling.on = True
    try:
        for budget, (eager_lp, eager_grad) in eager.items():
            lp, grad = logprobs_and_gradient(trainer, lambda: trainer_logprobs(trainer, samples, budget), weights)
            assert max(float((a - b).abs().max()) for a, b in zip(eager_lp, lp)) < 1e-4, budget
            assert float((grad - eager_grad).norm() / eager_grad.norm()) < 1e-4, budget
    finally:
        trainer.compiling.on = False
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled path really ran


@pytest.mark.slow
def test_the_start_up_check_keeps_a_bf16_base_that_agrees_and_refuses_one_that_does_not(trainer, generator,
                                                                                        monkeypatch):
    """The real bf16 base passes on the check's fixed batch (backends/bf16_check.py) with room to
    spare, so the decision does not flip with the CPU's kernels or thread count; a faulty one (a
    layer's weights doubled by the cast) is refused by its mean as well as its worst token, and
    the trainer stays fp32."""
    import torch

    from swarmling.backends.bf16_check import MEAN_NATS, check_bf16, check_samples
    from swarmling.backends.chat_template import render

    samples = check_samples(lambda p: generator.tokenize_prompt(render(p, generator.chat_template)), generator.tokenize)
    # The node checks at start-up, before a checkpoint's adapter is loaded: a fresh adapter is zero.
    trained = [p.data.clone() for p in trainer.params]
    for name, p in zip((n for n, q in trainer.model.named_parameters() if q.requires_grad), trainer.params):
        if "lora_B" in name:
            p.data.zero_()
    good = check_bf16(trainer, samples)
    assert good.agrees and 0 < good.mean_nats and trainer.bf16_base
    # Sound paths measured 0.024-0.051 across the CPU kinds; a margin of 1.5 at least on each.
    assert good.mean_nats <= MEAN_NATS / 1.5, good.describe()
    trainer.bf16_base = False
    real_setter = type(trainer).bf16_base.fset

    def faulty(self, on):
        real_setter(self, on)
        if on:
            w = self.causal_lm.model.layers[3].mlp.down_proj.base_layer.weight
            w.data = w.data * 2

    monkeypatch.setattr(type(trainer), "bf16_base", property(type(trainer).bf16_base.fget, faulty))
    bad = check_bf16(trainer, samples)
    assert not bad.agrees and not trainer.bf16_base
    assert bad.mean_nats >= 1.5 * MEAN_NATS, bad.describe()  # measured 0.35
    assert all(p.dtype == torch.float32 for p in trainer.causal_lm.parameters())
    for p, saved in zip(trainer.params, trained):
        p.data = saved


def saved_bytes(compute) -> int:
    """Bytes of distinct tensors autograd keeps for the backward pass while `compute` runs
    (parameters included: the same in both runs compared)."""
    import torch

    storages: dict[int, int] = {}

    def keep(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        compute()
    return sum(storages.values())


@pytest.mark.slow  # loads the model through its own fixture
def test_activation_checkpointing_computes_the_same_and_keeps_a_fraction_of_the_activations(trainer):
    """Checkpointing recomputes each layer in the backward pass with the same inputs and the same
    kernels, so logprobs and gradient match to rounding (measured: within 1e-5); what autograd
    keeps through the forward pass must shrink (measured on this batch: 597 MB without, ~430 MB
    of it views of the frozen weights, which are kept anyway; 8.5 MB with: the layers' inputs)."""
    import torch

    samples = batch()
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(len(s.completion_ids), generator=g) for s in samples]

    def compute():
        return trainer_logprobs(trainer, samples, 4096)

    embeddings = trainer.causal_lm.get_input_embeddings()
    hooks = len(embeddings._forward_hooks)
    plain_lp, plain_grad = logprobs_and_gradient(trainer, compute, weights)
    plain_saved = saved_bytes(compute)
    trainer.activation_checkpointing = True
    try:
        lp, grad = logprobs_and_gradient(trainer, compute, weights)
        saved = saved_bytes(compute)
    finally:
        trainer.activation_checkpointing = False
    # nothing left behind: no hook making the frozen embeddings' output require a gradient
    assert len(embeddings._forward_hooks) == hooks
    assert max(float((a - b).abs().max()) for a, b in zip(plain_lp, lp)) < 1e-5
    assert float((grad - plain_grad).norm() / plain_grad.norm()) < 1e-5
    print(f"kept for the backward pass: {saved / 1e6:.1f} MB with checkpointing, {plain_saved / 1e6:.1f} MB without")
    assert saved < plain_saved / 3
    # off again: as before (to within the dedupe by address, which a reused allocation can fool)
    assert not trainer.activation_checkpointing and abs(saved_bytes(compute) - plain_saved) < 0.05 * plain_saved


@pytest.mark.slow
def test_a_compile_fault_takes_a_bf16_base_chosen_for_compiling_back_to_fp32(trainer):
    """Eager bf16 rounds the adapter's updates away (tests/test_trainer_is_the_sampler.py): when
    compiling fails, a bf16 base that `auto` chose for the compiled trainer goes back to fp32; one
    the user forced (train.cpu_bf16 = "on") stays."""
    try:
        for chosen_for_compiling, stays in ((True, False), (False, True)):
            trainer.bf16_base, trainer.bf16_needs_compiling = True, chosen_for_compiling
            trainer._compiling_failed()
            assert trainer.bf16_base is stays
    finally:
        trainer.bf16_base, trainer.bf16_needs_compiling = False, False

"""The torch GRPO step on the real model: direction, ratios, sampler mismatch, abandonment."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from swarmling.backends.base import Abandoned, ChatPrompt, SamplingParams, TrainSample


def total(lp):
    return float(np.sum(lp))


def test_step_moves_policy_toward_rewarded_completion(backend):
    prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    good = backend.tokenize("8</answer>")
    bad = backend.tokenize("53 is the answer</answer>")
    samples = [TrainSample(prompt, good, 1.0), TrainSample(prompt, bad, -1.0)]
    before = backend.trainer.token_logprobs(samples)
    stats = backend.train_step(samples)
    after = backend.trainer.token_logprobs(samples)
    assert stats.tokens == len(good) + len(bad) and np.isfinite(stats.loss)
    assert total(after[0]) > total(before[0]) + 1e-3, (before[0], after[0])
    assert total(after[1]) < total(before[1]) - 1e-3


def test_ratios_are_one_when_the_policy_has_not_moved(backend):
    """pi_old from a separate no-grad pass (eval mode, other batching) must equal the training
    forward exactly; otherwise dropout, padding or temperature handling differ between the two."""
    gen = backend.generate(
        [ChatPrompt("Be brief.", "Count the legs of 2 cats."), ChatPrompt("Be brief.", "Name a fruit.", "<answer>")],
        3,
        SamplingParams(max_new_tokens=12, temperature=backend.settings.temperature, seed=5),
    )
    samples = [
        TrainSample(p, c.token_ids, adv, c.logprobs)
        for p, group in zip(gen.prompt_ids, gen.completions)
        for c, adv in zip(group, (1.0, -0.5, -0.5))
    ]
    old = [backend.trainer.token_logprobs([s])[0] for s in samples]  # one at a time: other padding
    with_old = [TrainSample(s.prompt_ids, s.completion_ids, s.advantage, s.behaviour_logprobs, o) for s, o in zip(samples, old)]
    stats = backend.train_step(with_old)
    assert stats.ratio_max_deviation < 1e-4
    assert abs(stats.ratio_mean - 1.0) < 1e-5 and stats.clip_fraction == 0.0
    # The sampler (llama.cpp on Q4_1) is close to the fp32 trainer but not identical: reported.
    assert 0.0 < stats.sampler_logprob_gap < 0.5
    assert 0.0 <= stats.sampler_ratio_outside < 0.3


def test_abandoned_step_changes_nothing(backend):
    prompt = backend.encode_prompt(ChatPrompt("", "Hi"))
    samples = [TrainSample(prompt, backend.tokenize("Hello"), 1.0), TrainSample(prompt, backend.tokenize("Bye"), -1.0)]
    before = {k: v.clone() for k, v in backend.trainer.lora_state().items()}
    with pytest.raises(Abandoned):
        backend.train_step(samples, should_stop=lambda: True)
    after = backend.trainer.lora_state()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_external_importance_weight_is_off_by_default_and_truncated_when_on():
    """Peers' completions: one weight per completion, min(exp(sum old logp - sender logp), cap)."""
    from swarmling.app.config import Config
    from swarmling.backends.settings import GrpoSettings
    from swarmling.backends.torch_grpo import external_weight, sequence_importance_weight

    samples = [
        TrainSample([1], [2, 3], 1.0),  # our own (no sender logprob): weight 1
        TrainSample([1], [4, 5, 6], 1.0, sequence_behaviour_logprob=-3.0),  # sender found it likelier than us
        TrainSample([1], [7], -1.0, sequence_behaviour_logprob=-9.0),  # sender found it far less likely
    ]
    owner = torch.tensor([0, 0, 1, 1, 1, 2])
    old = torch.tensor([-1.0, -1.0, -2.0, -2.0, -2.0, -1.0])  # sums: -2, -6, -1
    defaults = GrpoSettings.from_config(Config().train)
    assert defaults.external_importance_cap == 0.0
    # (peers' negatives have their own weight, on by default: tested below; off here, so this is the
    # importance cap alone)
    off = dataclasses.replace(defaults, external_negative_cap=0.0)
    assert external_weight(samples, owner, old, off, 0.0, []) is None  # off: external text counts fully
    capped = dataclasses.replace(defaults, external_importance_cap=2.0, external_negative_cap=0.0)
    w = external_weight(samples, owner, old, capped, 0.0, [])
    expected = [1.0, 1.0, np.exp(-3.0), np.exp(-3.0), np.exp(-3.0), 2.0]  # exp(-6+3); exp(-1+9) capped at 2
    assert torch.allclose(w, torch.tensor(expected, dtype=w.dtype), atol=1e-6)
    negatives: list[float] = []
    w = external_weight(samples, owner, old, defaults, 0.0, negatives)  # the default: negatives at most 1
    assert torch.allclose(w, torch.tensor([1.0] * 6, dtype=w.dtype)) and negatives == [1.0]
    assert float(sequence_importance_weight(torch.tensor(0.0), torch.tensor(-1e6), 5.0)) == 5.0  # no overflow


def test_a_microbatchs_token_weights_line_up_with_its_samples_and_take_its_own_sampler_gap():
    """A microbatch holds a reordered subset of the batch: `old_logprobs` and the weights follow
    its local order. The sampler's correction weighs this node's own tokens; a peer's negative
    reply is weighed with the gap measured on this microbatch's own replies, and with the node's
    running gap only where it has none."""
    from swarmling.app.config import Config
    from swarmling.backends.microbatches import SamplerGap
    from swarmling.backends.settings import GrpoSettings
    from swarmling.backends.torch_grpo import old_logprobs, token_weights

    samples = [
        TrainSample([1], [2, 3, 4], 1.0, behaviour_logprobs=[-1.0, -1.0, -1.0]),  # our own
        TrainSample([1], [5], 1.0),  # in another microbatch
        TrainSample([1], [6, 7], -1.0, old_logprobs=[-0.5, -0.5], sequence_behaviour_logprob=0.0),  # a peer's negative
    ]
    batch = [samples[i] for i in (2, 0)]  # the microbatch's scoring order
    owner = torch.tensor([0, 0, 1, 1, 1])
    old = old_logprobs(batch, owner, torch.tensor([-9.0, -9.0, -1.2, -1.2, -1.2]))
    assert torch.allclose(old, torch.tensor([-0.5, -0.5, -1.2, -1.2, -1.2]))  # the peer's given pi_old, in place
    settings = dataclasses.replace(GrpoSettings.from_config(Config().train), importance_cap=2.0,
                                   external_importance_cap=0.0, external_negative_cap=1.0)
    gap, negatives = SamplerGap(), []
    w = token_weights(batch, owner, old, settings, gap, 5.0, negatives)
    # own tokens: exp(-1.2 + 1.0); the peer's: exp(-1.0 - 2 x (-0.2) - 0.0), the gap being this batch's -0.2
    expected = [np.exp(-0.6)] * 2 + [np.exp(-0.2)] * 3
    assert torch.allclose(w, torch.tensor(expected, dtype=w.dtype), atol=1e-6)
    assert gap.tokens == 3 and negatives == pytest.approx([np.exp(-0.6)])
    alone = token_weights(batch[:1], owner[:2], old[:2], settings, SamplerGap(), 0.1, [])  # no own reply here
    assert torch.allclose(alone, torch.tensor([np.exp(-1.2)] * 2, dtype=alone.dtype), atol=1e-6)  # the running 0.1


def test_a_step_frees_the_samplers_cache_and_a_new_one_serves_the_same_policy(backend):
    """The KV cache (~0.2 GB in a default round) must not sit beside the step's activations at
    the node's peak: the step frees llama.cpp's context. The next call makes a new one, which
    samples as the old one did and carries the handed-off adapter."""
    prompts = [ChatPrompt("Be brief.", "Name a colour.")]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    first = backend.generate(prompts, 2, params)
    same_context = backend.generate(prompts, 2, params)
    prompt = first.prompt_ids[0]
    base_logits = backend.generator.prompt_logits(prompt)
    assert backend.generator._ctx is not None
    backend.train_step([TrainSample(prompt, first.completions[0][0].token_ids, 1.0),
                        TrainSample(prompt, first.completions[0][1].token_ids + [13], -1.0)])
    assert backend.generator._ctx is None
    after = backend.generate(prompts, 2, params)  # no hand-off yet: still the base policy
    assert [c.token_ids for c in after.completions[0]] == [c.token_ids for c in same_context.completions[0]]
    backend.hand_off()
    kept = backend.generator.prompt_logits(prompt)
    backend.generator.release_context()
    fresh = backend.generator.prompt_logits(prompt)
    assert np.array_equal(kept, fresh) and not np.array_equal(fresh, base_logits)


def test_the_anchor_is_the_k3_kl_to_the_base_model_computed_by_hand(backend):
    """After a step the policy differs from the base: the step's reported KL is the mean k3 of the
    trainer's logprobs against the same weights with the adapter switched off (the base)."""
    trainer = backend.trainer
    prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    samples = [TrainSample(prompt, backend.tokenize("8</answer>"), 1.0), TrainSample(prompt, backend.tokenize("9</answer>"), -1.0)]
    for _ in range(3):
        backend.train_step(samples)  # move away from the base
    policy = trainer.token_logprobs(samples)
    with trainer.model.disable_adapter():
        base = trainer.token_logprobs(samples)
    by_hand = np.mean([np.exp(b - p) - (b - p) - 1 for ps, bs in zip(policy, base) for p, b in zip(ps, bs)])
    assert by_hand > 1e-6  # the adapter did move the policy
    stats = backend.train_step(samples)
    assert trainer.grpo.kl_beta > 0 and np.isclose(stats.kl, by_hand, rtol=1e-3, atol=1e-7)
    assert stats.reference_seconds > 0 and stats.learning_rate > 0


def test_the_anchor_is_k2_on_own_replies_and_on_peers_replies_only_where_there_is_no_own_reply(backend):
    """The reported KL is k3 on the policy's own samples only: with a peer's reply in the batch it is
    still the mean over the own replies' tokens (a peer's text the policy finds unlikely would
    otherwise blow it up), and the loss's anchor is beta x the mean k2 over those tokens. A batch of
    peers' replies alone is anchored on them (k2 is bounded there) and reports no KL."""
    trainer = backend.trainer
    prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    own = [TrainSample(prompt, backend.tokenize("8</answer>"), 1.0), TrainSample(prompt, backend.tokenize("9</answer>"), -1.0)]
    for _ in range(3):
        backend.train_step(own)  # move away from the base
    peer = TrainSample(prompt, backend.tokenize("eight, I think</answer>"), 1.0, sequence_behaviour_logprob=-20.0,
                       from_peer=True)

    def by_hand(samples, estimator):
        policy = trainer.token_logprobs(samples)
        with trainer.model.disable_adapter():
            base = trainer.token_logprobs(samples)
        return np.mean([estimator(p, b) for ps, bs in zip(policy, base) for p, b in zip(ps, bs)])

    k3 = by_hand(own, lambda p, b: np.exp(b - p) - (b - p) - 1)
    k2_own, k2_peer = by_hand(own, lambda p, b: 0.5 * (p - b) ** 2), by_hand([peer], lambda p, b: 0.5 * (p - b) ** 2)
    assert k2_peer > 1e-6
    # With the step size at 0 the state stays put: the anchor adds beta x the own-token mean of k2
    # to the loss, whatever the share of peers' tokens in it.
    optim, grpo = trainer.optim, trainer.grpo
    trainer.optim = dataclasses.replace(optim, learning_rate=0.0)
    try:
        anchored = backend.train_step([own[0], peer, own[1]])
        alone = backend.train_step([peer])
        trainer.grpo = dataclasses.replace(grpo, kl_beta=0.0)
        unanchored = backend.train_step([own[0], peer, own[1]])
        alone_unanchored = backend.train_step([peer])
    finally:
        trainer.optim, trainer.grpo = optim, grpo
    assert np.isclose(anchored.kl, k3, rtol=1e-3, atol=1e-7)
    assert np.isclose(anchored.loss - unanchored.loss, grpo.kl_beta * k2_own, rtol=1e-3, atol=1e-7)
    assert alone.kl is None and alone.reference_seconds > 0
    assert np.isclose(alone.loss - alone_unanchored.loss, grpo.kl_beta * k2_peer, rtol=1e-3, atol=1e-7)


def test_a_peers_reply_pushed_down_weighs_at_most_one_and_nothing_from_another_model(backend):
    prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
    reply = backend.tokenize("9</answer>")
    ours = float(np.sum(backend.trainer.token_logprobs([TrainSample(prompt, reply, 0.0)])[0]))
    likelier_for_them = TrainSample(prompt, reply, -1.0, sequence_behaviour_logprob=ours + 2.0)
    stats = backend.train_step([TrainSample(prompt, backend.tokenize("8</answer>"), 1.0), likelier_for_them])
    assert 0.05 < stats.external_negative_weight < 0.5  # about e^-2 (and our own sampler's gap)
    from_other = TrainSample(prompt, reply, -1.0, sequence_behaviour_logprob=ours, from_other_model=True)
    assert backend.train_step([TrainSample(prompt, backend.tokenize("8</answer>"), 1.0), from_other]).external_negative_weight == 0.0

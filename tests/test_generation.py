"""llama.cpp batched generation: shapes, token ids, and logprobs that are the real sampling logprobs."""

from __future__ import annotations

import numpy as np

from swarmling.backends.base import ChatPrompt, SamplingParams
from swarmling.backends.chat_template import render


def prompt_ids(generator, question, prefill=""):
    return generator.tokenize_prompt(render(ChatPrompt("Be brief.", question, prefill), generator.chat_template))


def test_shapes_and_token_ids(generator):
    prompts = [prompt_ids(generator, "What is 2 + 3?"), prompt_ids(generator, "Name a colour.", "<answer>")]
    res = generator.generate(prompts, 3, SamplingParams(max_new_tokens=12, temperature=1.0, seed=1))
    assert len(res.completions) == 2 and all(len(group) == 3 for group in res.completions)
    assert res.prompt_ids == prompts
    for group in res.completions:
        for c in group:
            assert 1 <= len(c.token_ids) <= 12
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 1e-6 for lp in c.logprobs)
            assert c.finish_reason in ("eos", "length")
            text_ids = c.token_ids[:-1] if c.finish_reason == "eos" else c.token_ids
            assert generator.detokenize(text_ids) == c.text
    assert res.generated_tokens == sum(len(c.token_ids) for g in res.completions for c in g)
    assert res.tokens_per_s > 0
    # The benchmark's profile: the first token of each reply comes from the prefill's logits, every
    # later one from a decode step over the replies still live; the common prefix is decoded once.
    profile = generator.last_profile
    assert sum(profile.live_per_step) == res.generated_tokens - 6 and profile.live_per_step[0] <= 6
    assert profile.prefill_tokens < sum(len(p) for p in prompts) and profile.prefill_s > 0 and profile.decode_s > 0
    assert profile.total_s >= profile.prefill_s + profile.decode_s
    assert len(profile.seconds_per_step) == len(profile.live_per_step)
    assert abs(sum(profile.seconds_per_step) - profile.decode_s) < 1e-9


def test_same_seed_same_samples(generator):
    ids = [prompt_ids(generator, "Count to five.")]
    params = SamplingParams(max_new_tokens=10, temperature=0.9, seed=42)
    a = generator.generate(ids, 2, params).completions[0]
    b = generator.generate(ids, 2, params).completions[0]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_logprobs_match_a_full_forward(generator):
    """The logprob reported for each sampled token equals log softmax(logits / T) of a separate,
    non-batched forward pass over prompt + completion: batching and KV sharing change nothing."""
    temperature = 0.7
    ids = [prompt_ids(generator, "Tell me about cats."), prompt_ids(generator, "What is 7 * 6?")]
    res = generator.generate(ids, 2, SamplingParams(max_new_tokens=16, temperature=temperature, seed=3))
    for p, group in zip(ids, res.completions):
        for c in group:
            logits = generator.prompt_logits(p + c.token_ids).astype(np.float64) / temperature
            rows = logits[len(p) - 1 : len(p) - 1 + len(c.token_ids)]
            ref = rows[np.arange(len(c.token_ids)), c.token_ids] - np.logaddexp.reduce(rows, axis=1)
            # batch vs single decode run different kernels: tiny float differences only
            assert np.allclose(c.logprobs, ref, atol=0.05), (c.logprobs, ref)


def test_stop_string_and_abandon(generator):
    ids = [prompt_ids(generator, "Reply with <answer>4</answer> exactly.", "<answer>")]
    res = generator.generate(ids, 4, SamplingParams(max_new_tokens=40, temperature=1.0, stop=("</answer>",), seed=0))
    for c in res.completions[0]:
        if c.finish_reason == "stop":
            assert "</answer>" in c.text
        else:
            assert "</answer>" not in c.text
    res = generator.generate(ids, 2, SamplingParams(max_new_tokens=40, seed=0), should_stop=lambda: True)
    assert all(c.finish_reason == "abandoned" for c in res.completions[0])


def test_reference_decode_for_the_benchmark(generator):
    ids = [prompt_ids(generator, "Hi"), prompt_ids(generator, "Tell me a story about a long road.")]
    lengths = [[3, 5], [1, 4]]
    tokens, seconds = generator.reference_decode(ids, 2, lengths, temperature=1.0)
    assert tokens == 13 and seconds > 0


def test_prompts_share_their_common_prefix_and_each_keeps_its_last_token():
    from swarmling.backends.llama_cpp_generator import common_prefix_length

    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # the last token's logits start the reply
    assert common_prefix_length([[7, 1], [8, 1]]) == 0


def test_a_batch_of_chat_prompts_samples_as_each_alone_would(generator):
    """The system turn decoded once and shared changes no logit a prompt's reply starts from."""
    ids = [prompt_ids(generator, q, "<answer>") for q in ("What is 2 + 3?", "What is 10 - 4?", "Spell cat.")]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.01, seed=1)
    together = generator.generate(ids, 1, greedy).completions
    alone = [generator.generate([p], 1, greedy).completions[0] for p in ids]
    assert [g[0].token_ids for g in together] == [g[0].token_ids for g in alone]
    assert np.allclose([g[0].logprobs[0] for g in together], [g[0].logprobs[0] for g in alone], atol=0.05)

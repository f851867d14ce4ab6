"""Batched sampling with per-token logprobs on llama.cpp's low-level API, with LoRA hot-swap.

Why the low-level API: the high-level `Llama` object samples one sequence at a time and its
`logprobs=` option needs `logits_all=True` (≈ 9 tok/s here). Instead all completions of a round
share one context (`kv_unified`, one sequence id each): every prompt is decoded once and its KV
cells are shared with its G completions by `llama_memory_seq_cp`, then each step decodes one
token for every live sequence in a single `llama_decode`. Sampling happens in numpy on the whole
(live sequences × vocab) logits matrix, which gives the exact logprob of each sampled token
for the cost of one softmax per row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc
import numpy as np

from .base import Completion, GenerationProfile, GenerationResult, ProgressCallback, SamplingParams, StopCheck
from .completion import check_sampling, generation_result
from .llama_cpp_engine import LlamaCppEngine, LlamaCppError
from .sequence_end import SequenceEnd

__all__ = ["LlamaCppError", "LlamaCppGenerator", "common_prefix_length"]


@dataclass
class _Seq:
    prompt_index: int
    end: SequenceEnd[bytes]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class LlamaCppGenerator(LlamaCppEngine):
    """Samples a round's completions with their logprobs (and the benchmark's reference decode)
    on a `LlamaCppEngine`."""

    def __init__(self, gguf_path: Path, threads: int) -> None:
        super().__init__(gguf_path, threads)
        self.last_profile = GenerationProfile()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        check_sampling(params)
        start = time.perf_counter()
        rng = np.random.default_rng(params.seed)
        n_prompts = len(prompt_ids)
        n_seqs = n_prompts * n
        prompt_tokens = sum(len(p) for p in prompt_ids)
        cells = prompt_tokens + n_seqs * (params.max_new_tokens + 1) + 16
        max_prompt = max(len(p) for p in prompt_ids)
        batch_cap = max(n_seqs, max_prompt)
        self._ensure_context(cells, n_seqs, batch_cap)
        memory = lc.llama_get_memory(self._ctx)
        # Byte pieces: a stop string is found even when its token splits a UTF-8 character.
        stops = [s.encode("utf-8") for s in params.stop]
        seqs = [
            _Seq(i // n, SequenceEnd(params.max_new_tokens, stops, self.is_end_of_generation, self._piece))
            for i in range(n_seqs)
        ]
        batch = lc.llama_batch_init(batch_cap, 0, 1)
        try:
            # Prefill: each prompt once, as the sequence of its first completion; its KV cells are
            # then shared with the prompt's other completions.
            logits_by_prompt: dict[int, np.ndarray] = {}

            def keep_rows(which: list[int], _positions: list[int]) -> None:
                logits = self._logits(len(which))
                for row, p in enumerate(which):
                    logits_by_prompt[p] = logits[row].copy()

            profile = GenerationProfile()
            tick = time.perf_counter()
            profile.prefill_tokens = self._prefill_prompts(batch, batch_cap, prompt_ids, n, keep_rows)
            profile.prefill_s = time.perf_counter() - tick

            # First token of every completion comes from its prompt's last-position logits.
            live = list(range(n_seqs))
            generated = 0
            rows = np.stack([logits_by_prompt[s.prompt_index] for s in seqs])
            while live:
                if should_stop is not None and should_stop():
                    for i in live:
                        seqs[i].end.abandon()
                    break
                tokens, logprobs = _sample(rows, params.temperature, rng)
                still: list[int] = []
                for row, i in enumerate(live):
                    s = seqs[i]
                    tok = int(tokens[row])
                    s.token_ids.append(tok)
                    s.logprobs.append(float(logprobs[row]))
                    if not s.end.add(tok):
                        still.append(i)
                generated += len(live)
                live = still
                if on_progress is not None:
                    on_progress(n_seqs - len(live), n_seqs, generated)
                if not live:
                    break
                entries = [
                    (seqs[i].token_ids[-1], len(prompt_ids[seqs[i].prompt_index]) + len(seqs[i].token_ids) - 1, i, True)
                    for i in live
                ]
                tick = time.perf_counter()
                self._decode(batch, entries)
                step_s = time.perf_counter() - tick
                profile.decode_s += step_s
                profile.live_per_step.append(len(live))
                profile.seconds_per_step.append(step_s)
                rows = self._logits(len(live))
        finally:
            lc.llama_batch_free(batch)
            lc.llama_memory_clear(memory, True)
        profile.total_s = time.perf_counter() - start
        self.last_profile = profile

        completions = [Completion(self._visible_text(s), s.token_ids, s.logprobs, s.end.finish_reason) for s in seqs]
        return generation_result(prompt_ids, n, completions, start)

    def _visible_text(self, s: _Seq) -> str:
        """The completion's text: its end-of-generation token, when it has one, writes none."""
        return self.detokenize(s.token_ids[:-1] if s.end.reason == "eos" else s.token_ids)

    def _prefill_prompts(self, batch, batch_cap: int, prompt_ids, n: int, on_decoded) -> int:
        """Decode every prompt once into sequence p * n and share its KV cells with its other n - 1
        sequences. The prompts' common prefix (the chat template's system turn: about half of a
        short task's prompt) is decoded once and shared with every prompt before their own tokens
        are decoded, several prompts per llama_decode while they fit in the batch;
        `on_decoded(prompt indices, batch positions of their last tokens)` is called after each
        decode (logits rows are in that order). Returns the number of tokens decoded."""
        memory = lc.llama_get_memory(self._ctx)
        shared = common_prefix_length(prompt_ids) if len(prompt_ids) > 1 else 0
        for start in range(0, shared, batch_cap):
            prefix = prompt_ids[0][start: min(shared, start + batch_cap)]
            self._decode(batch, [(t, start + i, 0, False) for i, t in enumerate(prefix)])
        for p in range(1, len(prompt_ids) if shared else 0):
            lc.llama_memory_seq_cp(memory, 0, p * n, -1, -1)

        def flush(which: list[int]) -> None:
            entries, last_positions = [], []
            for p in which:
                ids = prompt_ids[p]
                entries.extend((ids[pos], pos, p * n, pos == len(ids) - 1) for pos in range(shared, len(ids)))
                last_positions.append(len(entries) - 1)
            self._decode(batch, entries)
            on_decoded(which, last_positions)

        pending: list[int] = []
        used = 0
        for p, ids in enumerate(prompt_ids):
            if used + len(ids) - shared > batch_cap and pending:
                flush(pending)
                pending, used = [], 0
            pending.append(p)
            used += len(ids) - shared
        if pending:
            flush(pending)
        for p in range(len(prompt_ids)):
            for g in range(1, n):
                lc.llama_memory_seq_cp(memory, p * n, p * n + g, -1, -1)
        return shared + sum(len(ids) - shared for ids in prompt_ids)

    def reference_decode(
        self, prompt_ids: Sequence[Sequence[int]], n: int, lengths: Sequence[Sequence[int]], temperature: float, seed: int = 0
    ) -> tuple[int, float]:
        """Raw llama.cpp throughput for the benchmark: the same prompts, `n` sequences each, decoding
        exactly `lengths[p][g]` tokens per sequence with llama.cpp's own C sampler (temperature +
        dist), no logprobs, no Python-side sampling. Returns (tokens, seconds)."""
        n_seqs = len(prompt_ids) * n
        cells = sum(len(p) for p in prompt_ids) + sum(sum(ls) for ls in lengths) + n_seqs + 16
        batch_cap = max(n_seqs, max(len(p) for p in prompt_ids))
        self._ensure_context(cells, n_seqs, batch_cap)
        memory = lc.llama_get_memory(self._ctx)
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(temperature))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
        batch = lc.llama_batch_init(batch_cap, 0, 1)
        start = time.perf_counter()
        tokens = 0
        try:
            first_token: dict[int, int] = {}

            def sample_first(which: list[int], positions: list[int]) -> None:
                for p, position in zip(which, positions):  # llama.cpp indexes logits by batch position
                    for g in range(n):
                        first_token[p * n + g] = lc.llama_sampler_sample(chain, self._ctx, position)

            self._prefill_prompts(batch, batch_cap, prompt_ids, n, sample_first)
            remaining = {i: lengths[i // n][i % n] for i in range(n_seqs)}
            last = dict(first_token)
            made = {i: 1 for i in range(n_seqs)}
            tokens = n_seqs
            while True:
                live = [i for i in range(n_seqs) if made[i] < remaining[i]]
                if not live:
                    break
                entries = [(last[i], len(prompt_ids[i // n]) + made[i] - 1, i, True) for i in live]
                self._decode(batch, entries)
                for row, i in enumerate(live):
                    last[i] = lc.llama_sampler_sample(chain, self._ctx, row)
                    made[i] += 1
                    tokens += 1
        finally:
            lc.llama_batch_free(batch)
            lc.llama_sampler_free(chain)
            lc.llama_memory_clear(memory, True)
        return tokens, time.perf_counter() - start


def common_prefix_length(prompt_ids: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least its last token to decode (whose
    logits give the prompt's first reply token)."""
    shortest = min(len(p) for p in prompt_ids)
    length = 0
    while length < shortest - 1 and all(p[length] == prompt_ids[0][length] for p in prompt_ids):
        length += 1
    return length


def _sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample one token per row from softmax(logits / T); return tokens and their logprobs."""
    x = logits.astype(np.float32, copy=True)
    x /= temperature
    peak = x.max(axis=1, keepdims=True)
    x -= peak
    np.exp(x, out=x)
    cdf = np.cumsum(x, axis=1)
    total = cdf[:, -1]
    u = rng.random(len(total)) * total
    tokens = np.array([np.searchsorted(cdf[r], u[r], side="right") for r in range(len(total))])
    tokens = np.minimum(tokens, logits.shape[1] - 1)
    picked = logits[np.arange(len(tokens)), tokens].astype(np.float64) / temperature
    logprobs = picked - peak[:, 0].astype(np.float64) - np.log(total.astype(np.float64))
    return tokens, logprobs

"""Batched sampling in torch from the trainer's own model (base weights + the live LoRA adapter).

One copy of the weights serves generation and training, so the policy that samples is the policy
that learns: hand-off costs nothing, and the logprobs returned here are the ones the training
forward pass recomputes, up to floating-point differences between a KV-cached, left-padded decode
and a right-padded full forward (reported each round as `sampler_logprob_gap`).

All Q×G sequences decode together: prompts are left-padded (to a bucketed width), prefilled into a
static KV cache, then one token per step for every sequence. A sequence stops at EOS, at a stop string
or at max tokens (`sequence_end.py`, as every generator). The tokens reach the host every few steps
(a device sync each time) and are checked one by one there, so a sequence is cut back to the token
that completed a stop string, which is where llama.cpp's generator stops too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from .base import Completion, GenerationResult, ProgressCallback, SamplingParams, StopCheck
from .completion import check_sampling, generation_result
from .incremental_text import IncrementalText
from .sequence_end import SequenceEnd

STOP_CHECK_EVERY = 8  # decode steps between host-side checks (stop strings, all finished)
PROMPT_BUCKET = 32  # prompt widths are padded up to a multiple of this

log = logging.getLogger(__name__)


class TorchGenerator:
    def __init__(self, model, tokenizer, eos_ids: set[int], softcap: float | None = None, compile_step: bool = False) -> None:
        self.model = model  # the trainer's model: peft-wrapped (LoRA) or the plain causal LM (full)
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.softcap = softcap
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._backbone = base.model
        self._lm_head = base.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
        # On a GPU, the one-token step is captured as CUDA graphs: its shapes are static (a static
        # KV cache, a full-length mask updated in place, bucketed prompt widths). The first round
        # pays the compilation; later rounds with the same shape replay the graphs.
        self._compiled = torch.compile(self._step, mode="reduce-overhead", dynamic=False) if compile_step else None
        self.compile_failure = ""  # why decoding went eager, if compiling failed
        self._cache = None
        self._cache_shape: tuple[int, int] | None = None

    def _next_logprobs(self, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
        logits = self._lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return torch.log_softmax(logits / temperature, dim=-1)

    @torch.no_grad()
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
        was_training = self.model.training
        self.model.eval()
        try:
            completions = self._decode(prompt_ids, n, params, should_stop, on_progress)
        finally:
            self.model.train(was_training)
        return generation_result(prompt_ids, n, completions, start)

    def _step(self, ids, mask, positions, cache_position, cache, temperature: float) -> torch.Tensor:
        """One forward over the cache: next-token logprobs at every sequence's last position."""
        out = self._backbone(input_ids=ids, attention_mask=mask, position_ids=positions,
                             cache_position=cache_position, past_key_values=cache, use_cache=True)
        return self._next_logprobs(out.last_hidden_state[:, -1], temperature)

    def _decode(self, prompt_ids, n, params, should_stop, on_progress) -> list[Completion]:
        from transformers import StaticCache

        dev = self.device
        rows = [list(p) for p in prompt_ids for _ in range(n)]
        batch = len(rows)
        # Bucketed widths: rounds repeat the same shapes, so a compiled step is reused, not rebuilt.
        width = -(-max(len(r) for r in rows) // PROMPT_BUCKET) * PROMPT_BUCKET
        total = width + params.max_new_tokens
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, total), dtype=torch.long)
        for b, r in enumerate(rows):  # left padding: every sequence's next token sits in the last column
            ids[b, width - len(r):] = torch.tensor(r)
            mask[b, width - len(r):width] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        cache = self._cache_for(batch, total, StaticCache)
        gen = torch.Generator(device=dev)
        gen.manual_seed(params.seed if params.seed is not None else int(torch.seed() % 2**63))
        eos = torch.tensor(sorted(self.eos_ids), device=dev)

        logp = self._step(ids, mask, positions, torch.arange(width, device=dev), cache, params.temperature)
        last_pos = positions[:, -1:]
        tokens, token_lps = [], []
        done = torch.zeros(batch, dtype=torch.bool, device=dev)
        ends = [self._sequence_end(params) for _ in range(batch)]
        checked = 0  # steps whose tokens the ends have seen
        abandoned = False
        for step in range(params.max_new_tokens):
            if should_stop is not None and should_stop():
                abandoned = True
                break
            nxt = torch.multinomial(logp.exp(), 1, generator=gen)
            tokens.append(nxt[:, 0])
            token_lps.append(logp.gather(-1, nxt)[:, 0])
            done |= torch.isin(nxt[:, 0], eos)
            last = step + 1 == params.max_new_tokens
            if last or (step + 1) % STOP_CHECK_EVERY == 0:
                _feed(ends, torch.stack(tokens[checked:], dim=1).tolist())
                checked = len(tokens)
                done |= torch.tensor([e.reason is not None for e in ends], device=dev)
                if on_progress is not None:
                    on_progress(int(done.sum()), batch, sum(e.tokens for e in ends))
                if bool(done.all()):
                    break
            if last:
                break
            mask[:, width + step] = 1
            last_pos = last_pos + 1
            cache_position = torch.tensor([width + step], device=dev)
            logp = self._decode_step(nxt, mask, last_pos, cache_position, cache, params.temperature)

        all_tokens = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in range(batch)]
        all_lps = torch.stack(token_lps, dim=1).tolist() if tokens else [[] for _ in range(batch)]
        completions = []
        for b, end in enumerate(ends):
            # An abandoned sequence keeps what it sampled, including steps not checked yet.
            keep = end.tokens if end.reason is not None else len(all_tokens[b])
            if abandoned:
                end.abandon()
            ids = all_tokens[b][:keep]
            completions.append(Completion(self._text(ids), ids, all_lps[b][:keep], end.finish_reason))
        return completions

    def _sequence_end(self, params: SamplingParams) -> SequenceEnd[str]:
        return SequenceEnd(params.max_new_tokens, params.stop, self.eos_ids.__contains__, IncrementalText(self._text).add)

    def _cache_for(self, batch: int, total: int, factory):
        """One static KV cache, reused (zeroed) while the round's shape stays the same: captured
        CUDA graphs point at its tensors, so a fresh cache each round would mean re-capturing."""
        if self._cache is None or self._cache_shape != (batch, total):
            self._cache, self._cache_shape = factory(config=self._backbone.config, max_cache_len=total), (batch, total)
        else:
            self._cache.reset()
        return self._cache

    @property
    def decoding(self) -> str:
        """How the one-token step runs: compiled (CUDA graphs), or eager and why."""
        if self._compiled is not None:
            return "compiled (CUDA graphs)"
        return f"eager ({self.compile_failure})" if self.compile_failure else "eager"

    def _decode_step(self, *args) -> torch.Tensor:
        """The per-token step: compiled (CUDA graphs) when asked for, eager otherwise or if
        compiling fails on this model/torch (logged once, never fatal)."""
        if self._compiled is None:
            return self._step(*args)
        try:
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 — a compiler failure must not end the round
            log.warning("compiled decoding failed (%s: %s); decoding eagerly from now on", type(exc).__name__, exc)
            self.compile_failure = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self._compiled = None
            return self._step(*args)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _feed(ends: list[SequenceEnd[str]], new_tokens: list[list[int]]) -> None:
    """Each running sequence's tokens since the last check, in order, until it ends."""
    for end, row in zip(ends, new_tokens):
        for token in row:
            if end.add(token):
                break

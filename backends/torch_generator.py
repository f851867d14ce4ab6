"""Batched sampling in torch from the trainer's own model (base weights + the live LoRA adapter).

One copy of the weights serves generation and training, so the policy that samples is the policy
that learns: hand-off costs nothing, and the logprobs returned here are the ones the training
forward pass recomputes, up to floating-point differences between a KV-cached, left-padded decode
and a right-padded full forward (reported each round as `sampler_logprob_gap`).

All Q×G sequences decode together: prompts are left-padded (to a bucketed width), prefilled into a
static KV cache, then one token per step for every sequence. A sequence stops at EOS, at a stop string
or at max tokens. Stop strings are checked on the decoded text every few steps (a device sync
each check), and the sequence is cut back to the token that completed the string, which is where
llama.cpp's generator stops too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from .base import Completion, GenerationResult, ProgressCallback, SamplingParams, StopCheck

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
        if params.temperature <= 0:
            raise ValueError("temperature must be > 0 (RL needs the sampling distribution's logprobs)")
        start = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            seqs, finish = self._decode(prompt_ids, n, params, should_stop, on_progress)
        finally:
            self.model.train(was_training)
        completions = []
        for p in range(len(prompt_ids)):
            row = []
            for i in range(p * n, (p + 1) * n):
                ids, lps = seqs[i]
                row.append(Completion(self._text(ids), ids, lps, finish[i]))  # type: ignore[arg-type]
            completions.append(row)
        return GenerationResult(
            prompt_ids=[list(p) for p in prompt_ids],
            completions=completions,
            seconds=time.perf_counter() - start,
            prefill_tokens=sum(len(p) for p in prompt_ids),
            generated_tokens=sum(len(ids) for ids, _ in seqs),
        )

    def _step(self, ids, mask, positions, cache_position, cache, temperature: float) -> torch.Tensor:
        """One forward over the cache: next-token logprobs at every sequence's last position."""
        out = self._backbone(input_ids=ids, attention_mask=mask, position_ids=positions,
                             cache_position=cache_position, past_key_values=cache, use_cache=True)
        return self._next_logprobs(out.last_hidden_state[:, -1], temperature)

    def _decode(self, prompt_ids, n, params, should_stop, on_progress):
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
        finish = ["length"] * batch
        ended_at = [params.max_new_tokens] * batch  # tokens kept per sequence
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
                self._note_finished(tokens, finish, ended_at, params.stop)
                done |= torch.tensor([f != "length" for f in finish], device=dev)
                if on_progress is not None:
                    on_progress(int(done.sum()), batch, sum(min(len(tokens), e) for e in ended_at))
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
        if not abandoned:
            self._note_finished(tokens, finish, ended_at, params.stop)
        seqs = []
        for b in range(batch):
            keep = min(ended_at[b], len(all_tokens[b]))
            if abandoned and finish[b] == "length":
                finish[b] = "abandoned"
            seqs.append((all_tokens[b][:keep], all_lps[b][:keep]))
        return seqs, finish

    def _cache_for(self, batch: int, total: int, factory):
        """One static KV cache, reused (zeroed) while the round's shape stays the same: captured
        CUDA graphs point at its tensors, so a fresh cache each round would mean re-capturing."""
        if self._cache is None or self._cache_shape != (batch, total):
            self._cache, self._cache_shape = factory(config=self._backbone.config, max_cache_len=total), (batch, total)
        else:
            self._cache.reset()
        return self._cache

    def _decode_step(self, *args) -> torch.Tensor:
        """The per-token step: compiled (CUDA graphs) when asked for, eager otherwise or if
        compiling fails on this model/torch (logged once, never fatal)."""
        if self._compiled is None:
            return self._step(*args)
        try:
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 — a compiler failure must not end the round
            log.warning("compiled decoding failed (%s: %s); decoding eagerly from now on", type(exc).__name__, exc)
            self._compiled = None
            return self._step(*args)

    def _note_finished(self, tokens, finish, ended_at, stops) -> None:
        """Host-side: where each still-running sequence ended (EOS or a stop string)."""
        if not tokens:
            return
        so_far = torch.stack(tokens, dim=1).tolist()
        for b, row in enumerate(so_far):
            if finish[b] != "length":
                continue
            eos_at = next((t for t, tok in enumerate(row) if tok in self.eos_ids), None)
            visible = row if eos_at is None else row[:eos_at]
            stop_at = self._stop_position(visible, stops) if stops else None
            if stop_at is not None:  # a stop string before any EOS wins
                finish[b], ended_at[b] = "stop", stop_at
            elif eos_at is not None:
                finish[b], ended_at[b] = "eos", eos_at + 1  # the EOS token is kept, as llama.cpp does

    def _stop_position(self, row: list[int], stops) -> int | None:
        """Tokens up to and including the one that completes the first stop string, or None."""
        if not any(s in self._text(row) for s in stops):
            return None
        # The last check found none, so the string was completed by one of the tokens since (a stop
        # string spans a few tokens at most: look back a little further).
        for t in range(max(1, len(row) - 2 * STOP_CHECK_EVERY), len(row) + 1):
            if any(s in self._text(row[:t]) for s in stops):
                return t
        return len(row)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

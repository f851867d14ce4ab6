"""Batched sampling in torch from the trainer's own model (base weights + the live LoRA adapter).

One copy of the weights serves generation and training, so the policy that samples is the policy
that learns: hand-off costs nothing, and the logprobs returned here are the ones the training
forward pass recomputes, up to floating-point differences between a KV-cached, left-padded decode
and a right-padded full forward (reported each round as `sampler_logprob_gap`).

All Q×G sequences decode together: prompts are left-padded once, prefilled once per completion
slot, then one token per step for every live sequence. A sequence stops at EOS, at a stop string
or at max tokens. Stop strings are checked on the decoded text every few steps (a device sync
each check), and the sequence is cut back to the token that completed the string, which is where
llama.cpp's generator stops too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .base import Completion, GenerationResult, ProgressCallback, SamplingParams, StopCheck

STOP_CHECK_EVERY = 8  # decode steps between host-side checks (stop strings, all finished)


class TorchGenerator:
    def __init__(self, model, tokenizer, eos_ids: set[int], softcap: float | None = None) -> None:
        self.model = model  # the peft-wrapped causal LM shared with the trainer
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.softcap = softcap
        base = model.get_base_model()
        self._backbone = base.model
        self._lm_head = base.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)

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
        from transformers import DynamicCache

        if params.temperature <= 0:
            raise ValueError("temperature must be > 0 (RL needs the sampling distribution's logprobs)")
        start = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            seqs, finish = self._decode(prompt_ids, n, params, should_stop, on_progress, DynamicCache())
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

    def _decode(self, prompt_ids, n, params, should_stop, on_progress, cache):
        dev = self.device
        rows = [list(p) for p in prompt_ids for _ in range(n)]
        batch, width = len(rows), max(len(r) for r in rows)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for b, r in enumerate(rows):  # left padding: every sequence's next token sits in the last column
            ids[b, width - len(r):] = torch.tensor(r)
            mask[b, width - len(r):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gen = torch.Generator(device=dev)
        gen.manual_seed(params.seed if params.seed is not None else int(torch.seed() % 2**63))
        eos = torch.tensor(sorted(self.eos_ids), device=dev)

        out = self._backbone(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True)
        logp = self._next_logprobs(out.last_hidden_state[:, -1], params.temperature)
        last_pos = positions[:, -1]
        tokens, token_lps = [], []
        done = torch.zeros(batch, dtype=torch.bool, device=dev)
        finish = ["length"] * batch
        ended_at = [params.max_new_tokens] * batch  # tokens kept per sequence
        abandoned = False
        for step in range(params.max_new_tokens):
            if should_stop is not None and should_stop():
                abandoned = True
                break
            nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            tokens.append(nxt)
            token_lps.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
            done |= torch.isin(nxt, eos)
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
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            out = self._backbone(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                                 past_key_values=cache, use_cache=True)
            logp = self._next_logprobs(out.last_hidden_state[:, -1], params.temperature)

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

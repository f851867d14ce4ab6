"""The MLX trainer's forward passes: per-token log-probabilities (or surprise) of a batch's
completions, each group's prompt run once and its completions attending to it (`shared_prefix.py`
lays the rows out; `SharedPrefixCache`, below, serves the prompt's keys and values), right-padded,
which causal attention needs no mask for."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .base import TrainSample
from .shared_prefix import Row, completion_inputs


def logprobs(model, samples: Sequence[TrainSample], rows: Sequence[Row], temperature: float,
         surprise: bool = False) -> mx.array:
    """log pi(completion token | prefix) for every completion token of `rows`, concatenated in
    row order (the order of `shared_prefix.layout`); with `surprise`, -log pi - H(pi) instead
    (Trainer.token_surprise)."""
    per_row = []
    for row in rows:
        logits, targets = _row_logits(model, samples, row, temperature)
        if surprise:  # the whole distribution, for its entropy: only here, not in the training pass
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            chosen = mx.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
            per_row.append(-chosen + (mx.exp(logp) * logp).sum(axis=-1))
        else:
            per_row.append(mx.take_along_axis(logits, targets[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1))
    return mx.concatenate(per_row)

def _row_logits(model, samples: Sequence[TrainSample], row: Row, temperature: float) -> tuple[mx.array, mx.array]:
    """One prompt pass, whose keys and values every completion of the row then attends to
    (positions after the prompt's, as in its own sequence); completions are right-padded,
    which causal attention never looks ahead at."""
    caches = [SharedPrefixCache() for _ in model.layers]
    prompt_logits = model(mx.array([row.prompt]), cache=caches)[0, -1:]
    members = [samples[i] for i in row.samples]
    width = max(completion_inputs(s) for s in members)
    scored, targets = [], []
    if width:
        ids = np.zeros((len(members), width), dtype=np.int32)
        for k, s in enumerate(members):
            ids[k, : completion_inputs(s)] = s.completion_ids[: completion_inputs(s)]
        logits = model(mx.array(ids), cache=caches).reshape(-1, prompt_logits.shape[-1])
        flat = mx.concatenate([prompt_logits, logits])
    else:
        flat = prompt_logits
    for k, s in enumerate(members):
        # token 0 is predicted by the prompt's last position (row 0), token t by row 1 + k * width + t - 1
        scored.extend([0] + [1 + k * width + t for t in range(completion_inputs(s))] if s.completion_ids else [])
        targets.extend(s.completion_ids)
    return flat[mx.array(scored)].astype(mx.float32) / temperature, mx.array(targets)


class SharedPrefixCache:
    """mlx-lm's per-layer cache protocol (offset, update_and_fetch, make_mask) for a shared
    prefix: the first call (the prompt, batch 1) is remembered; every later call (the
    completions, batch G) attends to it broadcast over the batch, at positions after it. Unlike
    mlx-lm's KVCache it never writes into a buffer, so gradients flow back into the prompt."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values, self.offset = keys, values, keys.shape[2]
            return keys, values
        batch = keys.shape[0]
        shared_k = mx.broadcast_to(self.keys, (batch, *self.keys.shape[1:]))
        shared_v = mx.broadcast_to(self.values, (batch, *self.values.shape[1:]))
        return mx.concatenate([shared_k, keys], axis=2), mx.concatenate([shared_v, values], axis=2)

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        from mlx_lm.models.base import create_causal_mask

        if window_size is not None:
            raise ValueError("shared-prefix training does not support sliding-window attention")
        if n == 1:
            return None  # one query attends to every key
        return create_causal_mask(n, offset=self.offset) if self.offset or return_array else "causal"

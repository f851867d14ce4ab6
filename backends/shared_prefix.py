"""Shared-prefix layout of a GRPO batch, framework-free (the torch and MLX trainers both use it).

A group's G completions all continue the same prompt. Trained one sequence each, the prompt is
recomputed G times (≈ 85% of the tokens of a default round). Here a group becomes one row:

    prompt | completion 1 | completion 2 | ... (each completion without its last token)

with positions restarting after the prompt for every completion (each sits at P, P+1, ... as in
its own sequence) and an attention mask that lets a completion see the prompt and itself only.
That is exactly the unshared computation, with the prompt's keys and values computed once; the
gradient reaches the prompt's positions from every completion, as it would from each separately.

The hidden state at position t predicts token t + 1, so a completion's first token is scored at
the prompt's last position and its last token is never an input: dropping it changes nothing.

Samples are grouped by identical prompt token ids, so peers' groups (one prompt by construction)
share too. A group whose row would exceed the microbatch budget is split into several rows, each
repeating the prompt: memory stays bounded whatever the group's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .base import TrainSample
from .microbatches import pack_microbatches

PADDING = -1  # segment of padding positions
PROMPT = 0  # segment of the prompt; completion k of a row is segment k + 1


@dataclass(frozen=True)
class Row:
    """One prompt and the samples (indices into the batch) whose completions follow it."""

    prompt: tuple[int, ...]
    samples: tuple[int, ...]


def completion_inputs(sample: TrainSample) -> int:
    """Input positions a completion adds to a row: all its tokens but the last."""
    return max(len(sample.completion_ids) - 1, 0)


def row_width(samples: Sequence[TrainSample], row: Row) -> int:
    return len(row.prompt) + sum(completion_inputs(samples[i]) for i in row.samples)


def shared_rows(samples: Sequence[TrainSample], token_budget: int) -> list[Row]:
    """One row per distinct prompt (first-seen order), split where it would exceed the budget."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    rows = []
    for prompt, members in groups.items():
        current: list[int] = []
        width = len(prompt)
        for i in members:
            extra = completion_inputs(samples[i])
            if current and width + extra > token_budget:
                rows.append(Row(prompt, tuple(current)))
                current, width = [], len(prompt)
            current.append(i)
            width += extra
        rows.append(Row(prompt, tuple(current)))
    return rows


def unshared_rows(samples: Sequence[TrainSample]) -> list[Row]:
    """One row per sample: the plain computation, each prompt recomputed (the benchmark's baseline)."""
    return [Row(tuple(s.prompt_ids), (i,)) for i, s in enumerate(samples)]


@dataclass
class RowBatch:
    """Right-padded rows of one microbatch, and where each completion token is scored."""

    input_ids: np.ndarray  # (B, W) int64, 0 on padding
    positions: np.ndarray  # (B, W) int64: the position each token has in its own sequence
    segments: np.ndarray  # (B, W) int64: PADDING, PROMPT, or k + 1 for the row's k-th completion
    samples: list[int]  # the batch's sample indices, in the order their tokens are scored
    scored: np.ndarray  # (T,) flat index into (B * W) of the hidden state predicting each token
    targets: np.ndarray  # (T,) the completion tokens
    owner: np.ndarray  # (T,) which of `samples` (local index) each token belongs to

    @property
    def computed_tokens(self) -> int:
        """Positions the model runs on, padding included."""
        return int(self.input_ids.size)


def layout(samples: Sequence[TrainSample], rows: Sequence[Row]) -> RowBatch:
    width = max(row_width(samples, r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    segments = np.full((len(rows), width), PADDING, dtype=np.int64)
    order: list[int] = []
    scored, targets, owner = [], [], []
    for b, row in enumerate(rows):
        p = len(row.prompt)
        ids[b, :p] = row.prompt
        positions[b, :p] = np.arange(p)
        segments[b, :p] = PROMPT
        start = p
        for k, i in enumerate(row.samples):
            completion = samples[i].completion_ids
            n = completion_inputs(samples[i])
            ids[b, start : start + n] = completion[:n]
            positions[b, start : start + n] = np.arange(p, p + n)
            segments[b, start : start + n] = k + 1
            # token 0 is predicted by the prompt's last position, token t by the completion's t - 1
            scored.extend([b * width + p - 1] + [b * width + start + t for t in range(n)] if completion else [])
            targets.extend(completion)
            owner.extend([len(order)] * len(completion))
            order.append(i)
            start += n
    return RowBatch(ids, positions, segments, order, np.asarray(scored, dtype=np.int64),
                    np.asarray(targets, dtype=np.int64), np.asarray(owner, dtype=np.int64))


def packed_rows(samples: Sequence[TrainSample], token_budget: int, shared: bool = True) -> list[list[Row]]:
    """The batch in rows (shared prefixes, or one sample a row), packed into microbatches of at
    most `token_budget` padded positions (a wider row goes alone)."""
    rows = shared_rows(samples, token_budget) if shared else unshared_rows(samples)
    widths = [row_width(samples, r) for r in rows]
    return [[rows[j] for j in group] for group in pack_microbatches(widths, token_budget)]


def microbatches(samples: Sequence[TrainSample], token_budget: int, shared: bool = True) -> list[RowBatch]:
    """`packed_rows`, each microbatch laid out for one forward pass with the attention mask."""
    return [layout(samples, rows) for rows in packed_rows(samples, token_budget, shared)]


def attention_allowed(segments: np.ndarray) -> np.ndarray:
    """(B, W, W) boolean, True where query q may attend to key k: causally, to the prompt or to
    its own completion. A padding position attends to itself only, so no softmax row is empty
    (an empty one is NaN, and NaN would leak into the backward pass)."""
    width = segments.shape[1]
    q_seg, k_seg = segments[:, :, None], segments[:, None, :]
    causal = np.tril(np.ones((width, width), dtype=bool))[None]
    real = (q_seg != PADDING) & (k_seg != PADDING)
    allowed = causal & real & ((k_seg == PROMPT) | (k_seg == q_seg))
    return allowed | (np.eye(width, dtype=bool)[None] & (q_seg == PADDING))

"""A round's random draws, each from its own stream keyed by (the node's seed, the round, what it
is for): the questions, the sampling seed, the training set's selection, the bundles to fetch.

Keyed streams are common random numbers: two nodes on the same seed (the two arms of an
experiment's pair) draw the same questions and sampling seeds in every round, whatever the other
streams consumed or the network delivered, so the arms differ only in what they train on. They
also make a round reproducible from its number alone: a node resumed after round 40 draws for
round 41 what it would have drawn without stopping, with no generator state to save.
"""

from __future__ import annotations

import numpy as np

PURPOSES = ("tasks", "sampling", "selection", "fetches")


class RoundDraws:
    def __init__(self, seed: int, round_no: int, common_window: int | None = None) -> None:
        self.seed, self.round_no = int(seed), int(round_no)
        # The swarm's common stream's window (learning/rescue.py): a slice of the clock for a node,
        # the round number (the default) where rounds run in lockstep (an experiment).
        self.common_window = self.round_no if common_window is None else int(common_window)

    def stream(self, purpose: str) -> np.random.Generator:
        """A fresh generator for `purpose` in this round (the same on every call)."""
        return np.random.default_rng([self.seed, self.round_no, PURPOSES.index(purpose)])

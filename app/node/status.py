"""What the node shows of itself: the state a viewer or `swarmling status` reads, kept from the
events the node emits, and the log file's copy of its round lines and notices."""

from __future__ import annotations

import logging
import os
from collections import deque

from ..events import Event, Notice, RoundFinished, StateChanged
from ..learning.round_record import RoundRecord
from ..metrics import format_round

# Round lines and notices for the log file (the CLI attaches a rotating file handler); the
# terminal gets them from the headless printer or the TUI instead.
rounds_log = logging.getLogger("swarmling.rounds")
rounds_log.propagate = False
SWARM_SHARE_ROUNDS = 10  # rounds that trained, over which "learnt from the swarm" is averaged


class StatusBoard:
    """The node's run state, phase and last round, as events report them (any thread reads it)."""

    def __init__(self) -> None:
        self.state, self.detail, self.phase = "starting", "", ""
        self.last_record: RoundRecord | None = None
        self._swarm_shares: deque[float] = deque(maxlen=SWARM_SHARE_ROUNDS)

    def observe(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            self.state, self.detail = event.state, event.detail
        elif isinstance(event, RoundFinished):
            self.last_record = event.record
            if event.record.external_advantage_share is not None:
                self._swarm_shares.append(event.record.external_advantage_share)
            rounds_log.info(format_round(event.record))
        elif isinstance(event, Notice):
            level = {"error": logging.ERROR, "warning": logging.WARNING}.get(event.level, logging.INFO)
            rounds_log.log(level, event.text)

    def swarm_share(self) -> float | None:
        """The external groups' share of the advantage mass over the last rounds that trained."""
        shares = self._swarm_shares
        return round(sum(shares) / len(shares), 3) if shares else None

    def snapshot(self, *, round_no: int, suspended_for: str | None, model: str | None, backend: str | None,
                 swarm_host: dict | None) -> dict:
        """For `swarmling status`: plain data."""
        m = self.last_record
        return {
            "state": self.state,
            "detail": self.detail,
            "round": round_no,
            "phase": self.phase if self.state == "running" else "",
            "suspended_for": suspended_for,
            "pid": os.getpid(),
            "model": model,
            "backend": backend,
            "peers": m.swarm.peers if m is not None and m.swarm is not None else None,
            "swarm_host": swarm_host,
            "swarm_share": self.swarm_share(),
            "given": m.swarm.given if m is not None and m.swarm is not None else "",
            "last_round": {k: getattr(m, k) for k in ("round", "reward_mean", "solved", "questions", "wall_seconds",
                                                       "tokens_per_s", "learnable_groups", "rescued_by")} if m is not None else None,
            "best": {"accuracy": m.eval_best_accuracy, "round": m.eval_best_of_round}
            if m is not None and m.eval_best_accuracy is not None else None,
        }

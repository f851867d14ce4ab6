"""What the node shows of itself: the state a viewer or `swarmling status` reads, kept from the
events the node emits, and the log file's copy of its round lines and notices."""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import asdict, dataclass, fields

import msgspec

from ..events import Event, Notice, RoundFinished, StateChanged, SwarmHealth
from ..learning.round_record import RoundRecord
from ..metrics import format_round

# Round lines and notices for the log file (the CLI attaches a rotating file handler); the
# terminal gets them from the headless printer or the TUI instead.
rounds_log = logging.getLogger("swarmling.rounds")
rounds_log.propagate = False
SWARM_SHARE_ROUNDS = 10  # rounds that trained, over which "learnt from the swarm" is averaged


@dataclass(frozen=True)
class LastRound:
    round: int
    reward_mean: float
    solved: int
    questions: int
    wall_seconds: float
    tokens_per_s: float
    learnable_groups: int | None = None  # groups with right and wrong replies (None: an older node's status)
    rescued_by: str = ""  # peers whose right replies gave signal to groups that had none


@dataclass(frozen=True)
class BestScore:
    accuracy: float
    round: int


@dataclass(frozen=True)
class NodeStatus:
    """What `swarmling status` shows of a running node; crosses the control socket as JSON
    (`to_dict`, which `status --json` prints as it came)."""

    state: str
    detail: str
    round: int
    phase: str
    suspended_for: str | None
    pid: int
    model: str | None
    backend: str | None
    peers: int | None
    swarm_host: SwarmHealth | None
    swarm_share: float | None  # peers' groups' share of the advantage mass, last rounds that trained
    given: str  # what this node's rollouts gave the swarm, in words (swarm/given.py)
    last_round: LastRound | None
    best: BestScore | None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> NodeStatus:
        """The status a node sent; keys this version lacks are ignored and missing ones take
        their defaults (a node of another release may be the one running)."""
        def typed(kind, value):  # None where it lacks what this version cannot do without
            try:
                return kind(**{f.name: value[f.name] for f in fields(kind) if f.name in value}) if value else None
            except TypeError:
                return None
        plain = {f.name: data.get(f.name) for f in fields(cls)}
        return cls(**plain | {"detail": data.get("detail") or "", "phase": data.get("phase") or "",
                              "given": data.get("given") or "",
                              "swarm_host": typed(SwarmHealth, data.get("swarm_host")),
                              "last_round": typed(LastRound, data.get("last_round")),
                              "best": typed(BestScore, data.get("best"))})


class StatusBoard:
    """The node's run state, phase and last round, as events report them (any thread reads it)."""

    def __init__(self) -> None:
        self.state, self.detail, self.phase = "starting", "", ""
        # The last round finished and its record, both set here (the record first) and read in
        # the other order, so that no reader sees a round without its record.
        self.last_record: RoundRecord | None = None
        self.round = 0
        self._swarm_shares: deque[float] = deque(maxlen=SWARM_SHARE_ROUNDS)

    def resumed(self, round_no: int, saved_record: dict | None) -> None:
        """The node resumes after `round_no`: its record is the one its checkpoint saved."""
        try:
            self.last_record = RoundRecord.from_dict(saved_record) if saved_record else None
        except msgspec.ValidationError:  # a checkpoint of an earlier release: shown from the next round
            self.last_record = None
        self.round = round_no

    def observe(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            self.state, self.detail = event.state, event.detail
        elif isinstance(event, RoundFinished):
            self.last_record = event.record
            self.round = event.record.round
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

    def snapshot(self, *, suspended_for: str | None, model: str | None, backend: str | None,
                 swarm_host: SwarmHealth | None) -> NodeStatus:
        """For `swarmling status`."""
        round_no = self.round
        m = self.last_record
        swarm = m.swarm if m is not None else None
        return NodeStatus(
            state=self.state, detail=self.detail, round=round_no, phase=self.phase if self.state == "running" else "",
            suspended_for=suspended_for, pid=os.getpid(), model=model, backend=backend,
            peers=swarm.peers if swarm is not None else None, swarm_host=swarm_host, swarm_share=self.swarm_share(),
            given=swarm.given if swarm is not None else "",
            last_round=LastRound(m.round, m.reward_mean, m.solved, m.questions, m.wall_seconds, m.tokens_per_s,
                                 m.learnable_groups, m.rescued_by) if m is not None else None,
            best=BestScore(m.eval_best_accuracy, m.eval_best_of_round)
            if m is not None and m.eval_best_accuracy is not None else None,
        )

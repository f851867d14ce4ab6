"""The TUI's picture of the node: events folded into plain state, no Textual here.

The node's thread only appends to `EventQueue` (never blocks, never waits for the UI); the UI
drains it on a timer and folds the events into a `NodeView`. Each section of the view counts its
changes so that widgets redraw only when their part changed, at the timer's pace at most.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..events import (
    PHASES,
    Event,
    GroupView,
    NodeStarted,
    Notice,
    PeerView,
    PhaseChanged,
    Preparing,
    Progress,
    RoundFinished,
    RoundRollouts,
    StateChanged,
    SwarmUpdated,
)
from ..learning.round_record import RoundRecord
from ..sizing import RoundShape

MAX_QUEUED = 10_000  # a stalled UI drops the oldest events rather than grow without bound
MAX_HISTORY = 1_000  # rounds kept for the reward plot
MAX_ROLLOUTS = 200  # groups kept in the feed
MAX_LOG = 2_000


class EventQueue:
    """The node's listener: thread-safe, non-blocking, bounded."""

    def __init__(self, maxlen: int = MAX_QUEUED) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self) -> list[Event]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events


@dataclass
class TaskRow:
    dataset: str
    level: int
    last: float  # success on the last round that sampled it
    recent: deque = field(default_factory=lambda: deque(maxlen=10))

    @property
    def recent_mean(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else 0.0


@dataclass
class LogLine:
    when: float
    level: str
    text: str


@dataclass
class NodeView:
    # header
    model: str = ""
    backend: str = ""
    device: str = ""
    preset: str = ""
    peer_id: str = ""
    swarm: str = ""
    state: str = "starting"
    state_detail: str = ""
    shape: RoundShape | None = None  # the round the node runs (None until it has started)
    # round
    round: int = 0  # the round in flight (or the next one)
    phase: str = ""
    phases_done: set[str] = field(default_factory=set)
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase -> (done, total)
    tokens_per_s: float = 0.0
    last_round: RoundRecord | None = None  # the last finished round's record
    preparing: Preparing | None = None  # before the first round: what the node is doing
    # learning
    history: deque = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))  # (round, own, peers)
    evals: deque = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))  # (round, held-out accuracy)
    swarm_shares: deque = field(default_factory=lambda: deque(maxlen=10))  # external advantage share
    tasks: dict[str, TaskRow] = field(default_factory=dict)
    # swarm
    peers: tuple[PeerView, ...] = ()
    listen_addrs: tuple[str, ...] = ()
    bytes_in: int = 0
    bytes_out: int = 0
    host_restarts: int = 0
    reachability: str = ""  # swarm/nat/reachability.py's state, "" before the host said
    reachability_text: str = ""
    host_error: str = ""
    # feed and log
    rollouts: deque = field(default_factory=lambda: deque(maxlen=MAX_ROLLOUTS))  # newest first
    log: deque = field(default_factory=lambda: deque(maxlen=MAX_LOG))
    new_log: list[LogLine] = field(default_factory=list)  # lines not yet shown
    last_error: str = ""
    clock: Callable[[], float] = field(default_factory=lambda: time.time)  # fixed in snapshot tests
    # change counters, per section
    versions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("header", "round", "learning", "swarm", "rollouts", "log"), 0))

    def _bump(self, *sections: str) -> None:
        for s in sections:
            self.versions[s] += 1

    # ---- folding -------------------------------------------------------------------------------
    def apply_all(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: Event) -> None:
        if isinstance(event, Progress):
            self.progress[event.phase] = (event.done, event.total)
            if event.phase == "generate":
                self.tokens_per_s = event.tokens_per_s
            self._bump("round")
        elif isinstance(event, Preparing):
            self.preparing = event
            self._bump("round")
        elif isinstance(event, PhaseChanged):
            self.preparing = None
            if event.round != self.round:
                self.round = event.round
                self.phases_done = set()
                self.progress = {}
                self.tokens_per_s = 0.0
            if self.phase and self.phase != event.phase:
                self.phases_done.add(self.phase)
            self.phase = event.phase
            self._bump("round", "header")
        elif isinstance(event, RoundFinished):
            self._round_finished(event.record)
        elif isinstance(event, RoundRollouts):
            for group in event.groups:
                self.rollouts.appendleft(group)
            self._bump("rollouts")
        elif isinstance(event, SwarmUpdated):
            self.peers, self.listen_addrs = event.peers, event.listen_addrs
            self.bytes_in, self.bytes_out = event.bytes_in, event.bytes_out
            self.host_restarts, self.host_error = event.host_restarts, event.host_error
            self.reachability, self.reachability_text = event.reachability, event.reachability_text
            self.peer_id = event.peer_id
            self._bump("swarm", "header")
        elif isinstance(event, StateChanged):
            self.state, self.state_detail = event.state, event.detail
            if event.state in ("paused", "stopped", "failed"):
                self.phase = ""
            self._bump("header", "round")
        elif isinstance(event, NodeStarted):
            self.model, self.backend, self.device = event.model, event.backend, event.device
            self.preset, self.shape = event.preset, event.shape
            self.peer_id, self.swarm = event.peer_id, event.swarm
            self.round = event.resumed_round
            self._log("info", f"{event.model} on {event.backend} ({event.device}): {event.reason}")
            self._bump("header", "round")
        elif isinstance(event, Notice):
            self._log(event.level, event.text)
            if event.level == "error":
                self.last_error = event.text
                self._bump("header")

    def _log(self, level: str, text: str) -> None:
        line = LogLine(self.clock(), level, text)
        self.log.append(line)
        self.new_log.append(line)
        self._bump("log")

    def take_new_log(self) -> list[LogLine]:
        lines, self.new_log = self.new_log, []
        return lines

    def _round_finished(self, m: RoundRecord) -> None:
        self.last_round = m
        self.phases_done = set(PHASES)
        self.phase = ""
        self.history.append((m.round, m.reward_mean, m.external_reward_mean))
        if m.eval_accuracy is not None:
            self.evals.append((m.eval_of_round, m.eval_accuracy))
        if m.external_advantage_share is not None:
            self.swarm_shares.append(m.external_advantage_share)
        levels = m.levels
        for dataset, success in m.per_dataset.items():
            row = self.tasks.get(dataset) or self.tasks.setdefault(dataset, TaskRow(dataset, 0, 0.0))
            row.last = success
            row.recent.append(success)
        for dataset, level in levels.items():
            row = self.tasks.get(dataset) or self.tasks.setdefault(dataset, TaskRow(dataset, 0, 0.0))
            row.level = level
        self._bump("round", "learning")

    # ---- what widgets ask ----------------------------------------------------------------------
    def phase_fraction(self, phase: str) -> float | None:
        """0..1 for a phase's bar; None while a phase without countable work is running."""
        if phase in self.phases_done:
            return 1.0
        if phase != self.phase:
            return 0.0
        done, total = self.progress.get(phase, (0, 0))
        return done / total if total else None

    @property
    def external_share(self) -> str:
        m = self.last_round
        if m is None:
            return "-"
        return f"{m.local_groups} local / {m.external_groups} external"

    @property
    def given(self) -> str:
        """What this node's rollouts gave the swarm (swarm/given.py), from the last round's figures."""
        m = self.last_round
        return m.swarm.given if m is not None and m.swarm is not None else ""

    @property
    def swarm_share(self) -> float | None:
        """The swarm's share of what this node learnt over the last rounds that trained."""
        return sum(self.swarm_shares) / len(self.swarm_shares) if self.swarm_shares else None

    def rollout(self, index: int) -> GroupView | None:
        return self.rollouts[index] if 0 <= index < len(self.rollouts) else None

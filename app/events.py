"""What the node tells its viewers (the headless printer, the TUI).

Events are plain, immutable data built on the node's thread: a viewer may keep them, queue them
or drop them, and never reaches back into the node's live objects through them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .learning.round_record import RoundRecord
from .sizing import RoundShape

# The node's run state, as a viewer shows it.
STATES = ("starting", "running", "pausing", "paused", "finishing", "suspended", "stopping", "stopped", "failed")
# A round's phases, in the order app/learning/round.py runs them.
PHASES = ("tasks", "generate", "score", "share", "sample", "train", "hand-off")


@dataclass(frozen=True)
class NodeStarted:
    backend: str
    device: str
    model: str
    preset: str
    reason: str  # why this backend
    resumed_round: int  # 0 on a fresh start
    shape: RoundShape  # what its rounds generate and train on
    peer_id: str = ""  # empty when the swarm is off
    swarm: str = ""


@dataclass(frozen=True)
class StateChanged:
    state: str  # one of STATES
    detail: str = ""


@dataclass(frozen=True)
class Preparing:
    """Before the first round: what the node is doing (loading the model, converting it once for
    the trainer, scoring the weights it starts from), and how far, where that is countable."""

    what: str
    done: int = 0
    total: int = 0  # 0: nothing to count


@dataclass(frozen=True)
class PhaseChanged:
    round: int
    phase: str


@dataclass(frozen=True)
class Progress:
    """Within a phase: `done` of `total` units (sequences while generating, microbatches while
    training). Sent at most a few times a second."""

    round: int
    phase: str
    done: int
    total: int
    tokens_per_s: float = 0.0


@dataclass(frozen=True)
class RoundFinished:
    record: RoundRecord


@dataclass(frozen=True)
class CompletionView:
    text: str
    reward: float  # the shaped reward advantages were computed on
    strict: float  # the verifier's score


@dataclass(frozen=True)
class GroupView:
    """One question-group of a round, as the rollout feed shows it."""

    round: int
    source: str  # "local" or the peer id that sent it
    dataset: str
    level: int
    question: str
    completions: tuple[CompletionView, ...]
    trained: bool  # the round's GRPO step used it

    @property
    def reward_mean(self) -> float:
        return sum(c.strict for c in self.completions) / max(1, len(self.completions))


@dataclass(frozen=True)
class RoundRollouts:
    round: int
    groups: tuple[GroupView, ...]


@dataclass(frozen=True)
class PeerView:
    peer_id: str
    address: str = ""  # a dialable multiaddr when connected
    connected: bool = False
    fetch_seconds: float | None = None  # the last bundle fetch from it
    received: int = 0  # its groups that passed verification here
    used: int = 0  # of those, trained on
    rejected: int = 0  # its groups (or bundles) refused and held against it
    score: float = 0.0  # this node's application score for it (negative: misbehaved)


@dataclass(frozen=True)
class SwarmHealth:
    """The libp2p host as `swarmling status` shows it (it crosses the control socket as JSON)."""

    running: bool
    restarts: int
    last_error: str | None
    # (defaults: what an older node's status lacks reads as unknown)
    reachability: str = ""  # nat/reachability.py's state
    reachability_text: str = ""  # ... in words
    cut_off_rounds: int = 0  # rounds in a row in no gossip mesh while connected, once worth saying (0: not)


@dataclass(frozen=True)
class SwarmUpdated:
    peer_id: str
    listen_addrs: tuple[str, ...]
    peers: tuple[PeerView, ...] = field(default=())
    bytes_in: int = 0  # since start
    bytes_out: int = 0
    host_restarts: int = 0  # the supervised libp2p host, restarted after a failure
    host_error: str = ""  # why it last failed
    # Whether peers can dial this node (swarm/nat/reachability.py): the state, and what it means.
    reachability: str = ""  # "direct", "relayed", "unreachable", "unknown"
    reachability_text: str = ""


@dataclass(frozen=True)
class Notice:
    level: str  # "info", "warning", "error"
    text: str


Event = (
    NodeStarted | StateChanged | Preparing | PhaseChanged | Progress | RoundFinished | RoundRollouts | SwarmUpdated
    | Notice
)
Listener = Callable[[Event], None]


def group_views(round_no: int, groups, used_external, trained, prefill: str) -> tuple[GroupView, ...]:
    """A round's own groups and the peers' groups it trained on, as plain data for viewers
    (replies shown whole: with the `<answer>` the node pre-started them with)."""
    trained_ids = {id(g) for g in trained}
    return tuple(
        GroupView(
            round=round_no,
            source=g.source,
            dataset=g.task.spec.dataset,
            level=g.level,
            question=g.task.question,
            completions=tuple(CompletionView(prefill + c.text, c.reward, c.strict) for c in g.completions),
            trained=id(g) in trained_ids,
        )
        for g in [*groups, *used_external]
    )

"""The record of one finished round: what `metrics.jsonl` holds a line of, what checkpoints carry,
what the headless printer, the TUI and `swarmling sim` read.

One typed definition for all of them, so a renamed or missing field fails loudly instead of
drifting between copies. On disk the record stays the flat JSON object it always was: the
swarm's statistics are written beside the round's own fields (and only when the swarm is on),
`train` only when the round trained.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec


class TrainRecord(msgspec.Struct, kw_only=True, frozen=True):
    loss: float
    tokens: int
    grad_norm: float
    clip_fraction: float
    ratio_mean: float
    sampler_logprob_gap: float
    sampler_ratio_outside: float
    groups: int = 0  # question-groups in the batch (this round's and those that waited for it)
    kl: float | None = None  # mean k3 estimate of KL(pi || pi_base) per own token (None: no anchor, or no own reply)
    learning_rate: float = 0.0  # the step size of this update (warmup included)
    reference_seconds: float = 0.0  # the anchor's reference forward
    external_negative_weight: float | None = None  # mean weight of peers' replies pushed down


class SwarmRoundStats(msgspec.Struct, kw_only=True, frozen=True):
    """Network figures of one round (bytes on the wire, after encryption)."""

    peers: int = 0
    peers_heard: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    announcements_in: int = 0
    announcements_refused: dict[str, int] = msgspec.field(default_factory=dict)
    bundles_fetched: int = 0
    bundle_bytes_in: int = 0
    fetch_failures: list[str] = msgspec.field(default_factory=list)
    fetch_seconds_p50: float | None = None
    announce_latency_s_p50: float | None = None
    fetches_pending: int = 0  # fetches asked for and not finished when the round ended
    host_restarts: int = 0  # times the supervised libp2p host was restarted since the node started
    # Whether peers could dial this node (swarm/nat/reachability.py): direct, relayed, unreachable, unknown.
    reachability: str = ""
    # GossipSub's view: peers with a pubsub stream, peers in this node's meshes, and the lowest
    # score it gives any of them (below -80 a peer is graylisted: nothing it sends is read).
    gossip_peers: int = 0
    mesh_peers: int = 0
    lowest_gossip_score: float | None = None
    # Others' announcements not passed on for want of upload budget, since start (swarm/host/forwarding.py).
    forwards_withheld: int = 0
    # ... and not sent to a neighbour that asked for them by IWANT, since start (swarm/host/mesh.py).
    pulls_withheld: int = 0
    # Requests for our bundles answered "busy" for want of upload budget (resources.bandwidth_kib_s), since start.
    serves_withheld: int = 0
    # Connections held at the round's end, by why each is kept (swarm/host/host.py connection_figures).
    connections_held: dict[str, int] = msgspec.field(default_factory=dict)
    shards: int = 1  # announcement shards (topics) this node's estimate of the swarm's size chose (swarm/shards.py)
    # What this node gave (swarm/given.py): its bundles written whole to peers since it started,
    # those of the last 24 h, and to how many distinct peers.
    bundles_served: int = 0
    bundles_served_day: int = 0
    served_peers_day: int = 0
    # What peers said their updates trained on of ours in the last 24 h, and how many said so
    # (swarm/host/thanks.py): their word, shown as such and used for nothing else.
    trained_on_day: int = 0
    trained_by_peers_day: int = 0
    # Peers' groups refused this round in a way that counts against the peer (forged, malformed,
    # another swarm's...); the record's external_rejected counts these and the unblamed ones an
    # honest peer may send (replies this node cannot use, a preset it does not know).
    groups_blamed: int = 0

    @property
    def given(self) -> str:
        """"your rollouts: fetched 37x by 5 peers in 24 h", for the lines viewers show; "" before any."""
        if not self.bundles_served_day:
            return ""
        peers = self.served_peers_day
        said = f", trained on {self.trained_on_day}x (as {self.trained_by_peers_day} said)" if self.trained_on_day else ""
        return f"your rollouts: fetched {self.bundles_served_day}x by {peers} peer{'s' if peers != 1 else ''}{said} in 24 h"


SWARM_FIELDS = frozenset(SwarmRoundStats.__struct_fields__)


class EvalFields(TypedDict, total=False):
    """A held-out score as the round record holds it (learning/evaluation.eval_fields), on the
    rounds that measured one: RoundRecord's fields of the same names."""

    eval_accuracy: float
    eval_per_dataset: dict[str, float]
    eval_tag_rate: float
    eval_of_round: int
    eval_seconds: float
    eval_items: int
    eval_at_level_accuracy: float
    eval_at_level_per_dataset: dict[str, float]
    eval_levels: dict[str, int] | None


EVAL_FIELDS = tuple(EvalFields.__annotations__)


class RoundRecord(msgspec.Struct, kw_only=True, frozen=True):
    # ---- the round itself (app/round.py) ----
    round: int
    reward_mean: float  # strict: the verifier's score
    shaped_reward_mean: float  # with the format bonus
    format_bonus: float
    tag_rate: float
    questions: int
    completions: int
    solved: int
    signal_share: float  # groups with a non-zero advantage
    local_groups: int
    external_groups: int
    external_available: int
    # Peers' groups as this node's own verifier scored them (None: none were available).
    external_reward_mean: float | None
    trained_samples: int
    generated_tokens: int
    prefill_tokens: int
    tokens_per_s: float
    seconds: dict[str, float]  # per phase
    per_dataset: dict[str, float]  # strict success per dataset
    levels: dict[str, int]  # curriculum level per dataset after the round
    train: TrainRecord | None = None  # None: no group had a signal, nothing trained
    # Share of the trained groups whose signal was the format bonus alone (all replies equally
    # right or wrong): it should fall to 0 as the tag rate rises and the bonus fades.
    format_only_share: float | None = None  # None: nothing trained
    # Rounds since the trained external groups were admitted here (None: none trained).
    external_age_rounds_mean: float | None = None
    # How much of the update came from the swarm: the external groups' share of the advantage mass
    # (sum of |advantage| over the trained replies). None: nothing trained.
    external_advantage_share: float | None = None
    # Who taught this node what: peer id -> its groups the update trained on.
    external_groups_by_peer: dict[str, int] = msgspec.field(default_factory=dict)
    # ---- how the learning goes (every round) ----
    # The sampling policy's entropy per token (mean -log pi of the tokens it sampled): a collapse
    # to one answer shows here first.
    token_entropy: float | None = None
    distinct_answers: float | None = None  # distinct extracted answers per group of this round
    # Per dataset, the shares of this round's groups all right / all wrong / mixed.
    group_outcomes: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    # The minimum batch (train.min_signal_groups): groups with right and wrong replies in this
    # round's batch, the minimum, and the groups left waiting for the next step (0 when it trained).
    signal_groups: int = 0
    min_signal_groups: int = 0
    waiting_groups: int = 0
    # "Learnable": this round's own groups with right and wrong replies, the ones a step learns
    # from (signal_share also counts a spread of the format bonus alone), rescued ones included.
    # The one word the headless line, the TUI and `status` use for them.
    learnable_groups: int = 0
    # ---- the held-out score (learning/evaluation.py), on the rounds that measured it ----
    eval_accuracy: float | None = None
    eval_per_dataset: dict[str, float] | None = None
    eval_tag_rate: float | None = None  # replies that closed the tag (a reply without it is wrong)
    eval_of_round: int | None = None  # the round whose weights were evaluated (0: the base model)
    eval_seconds: float | None = None
    eval_items: int | None = None  # items in the fixed set (240 since this version; 96 before)
    # The same at the levels the node trains each dataset on (learning/evaluation.py's at-level set).
    eval_at_level_accuracy: float | None = None
    eval_at_level_per_dataset: dict[str, float] | None = None
    eval_levels: dict[str, int] | None = None
    # The best held-out accuracy so far and the round of its weights (kept in checkpoints/best).
    eval_best_accuracy: float | None = None
    eval_best_of_round: int | None = None
    # ---- the round as a whole, and what its caller measured when it closed (learning/round.py) ----
    external_rejected: int = 0
    # Reasoning mode: peers' groups dropped because a reply's text is unlike ours (learning/screening.py),
    # and the highest mean surprise per token of a reply among those screened.
    external_screened: int = 0
    external_text_surprise: float | None = None
    # Peers' groups on held-out questions, set aside without blame (learning/reserved.py).
    external_held_out: int = 0
    # Peers' groups of another preset than this node's, set aside without blame (learning/reserved.py).
    external_other_preset: int = 0
    # Rescue (learning/rescue.py): own all-wrong groups on common questions that peers' right
    # replies on the same question gave a signal this round, those replies per peer, and the own
    # groups still waiting for one.
    rescued_groups: int = 0
    rescued_replies_by_peer: dict[str, int] = msgspec.field(default_factory=dict)
    awaiting_rescue: int = 0
    timestamp: float = 0.0
    wall_seconds: float = 0.0
    model: str = ""
    preset: str = ""
    backend: str = ""
    # Resident memory after the round: a leak shows as a trend over hours (rl-swarm's Mac users
    # saw 87 GB after 18 h), so every record carries it.
    rss_bytes: int = 0
    swarm: SwarmRoundStats | None = None  # None: the swarm is off

    @property
    def rescued_by(self) -> str:
        """"rescued 2 (1 peer)": the rescues of this round, for the lines viewers show; "" without."""
        peers = len(self.rescued_replies_by_peer)
        return f"rescued {self.rescued_groups} ({peers} peer{'s' if peers != 1 else ''})" if self.rescued_groups else ""

    def to_dict(self) -> dict[str, Any]:
        data = msgspec.to_builtins(self)
        for optional in ("train", *EVAL_FIELDS):  # written only on the rounds that have them
            if data[optional] is None:
                del data[optional]
        swarm = data.pop("swarm")
        return data | (swarm or {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundRecord:
        """Raises msgspec.ValidationError when the object is not a round record."""
        own = {k: v for k, v in data.items() if k not in SWARM_FIELDS}
        if "peers" in data:
            own["swarm"] = {k: v for k, v in data.items() if k in SWARM_FIELDS}
        return msgspec.convert(own, cls)

    @property
    def swarm_stats(self) -> SwarmRoundStats:
        """The swarm's figures, zeros when it was off."""
        return self.swarm or SwarmRoundStats()

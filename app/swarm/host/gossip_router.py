"""The GossipSub router every host runs, as configured: a 1 s heartbeat that stays 1 s, the mesh
kept for the peers that matter (mesh.py), peer scores with positive weights as penalties, and
the library's defences that misfire on volunteers' addresses turned off. host.py starts it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.score import ScoreParams, TopicScoreParams

from .admission import Rank
from .forwarding import UploadBudget
from .mesh import KeepingGossipSub

GOSSIPSUB_PROTOCOL = TProtocol("/meshsub/1.1.0")


def gossip_router(keeps: Callable[[str], bool], rank: Rank, app_score: Callable[[str], float],
                  forwarding: UploadBudget | None) -> KeepingGossipSub:
    """`keeps`: peers pruned from the mesh last (dial targets, proven peers); `rank`: the rest's
    order (admission.Rank); `app_score`: what the node learnt from a peer's bundles (P6);
    `forwarding`: the upload forwarding may use (forwarding.py; None: a helper's, unbounded)."""
    return KeepingGossipSub(
        keeps=keeps,
        rank=rank,
        forwarding=forwarding,
        protocols=[GOSSIPSUB_PROTOCOL],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
        heartbeat_initial_delay=0.5,
        spam_protection_enabled=False,
        # py-libp2p 0.8.1's "adaptive gossip" (on by default) turns the heartbeat, whatever it
        # was set to, into one every 30 s when its health score is under 0.4 and every 60 s
        # under 0.7 (gossipsub.py _adapt_heartbeat_parameters, "more frequent" in its comment).
        # That score counts mesh peers with a positive score, which ours never give, and a
        # mesh short of 6: two honest nodes on 127.0.0.1 read 0.265 and beat every 30 s from
        # their first health update on (issue 41). Mesh repair, backoff expiry and the scores'
        # decay (0.99 a beat: set for 1 s) then ran 30-60x slower, and a mesh emptied under
        # attack stayed empty for minutes. Minimal reproduction: two GossipSub hosts meshed on
        # one topic, wait 31 s, read router.heartbeat_interval (30, not 1).
        adaptive_gossip_enabled=False,
        # Its IP-diversity grafting and pruning: volunteers behind one NAT, peers reached
        # through one helper's relay and every sim on 127.0.0.1 share an address (P7 is off
        # for the same reason), so it would prune honest peers as readily as anyone.
        eclipse_protection_enabled=False,
        score_params=_score_params(lambda pid: app_score(pid.to_base58())),
    )


def _score_params(app_score: Callable[[ID], float]) -> ScoreParams:
    return ScoreParams(
        # P4: a peer that forwards messages our validator rejects loses 10 per message (capped);
        # py-libp2p subtracts weight × count, so the weight is positive.
        p4_invalid_messages=TopicScoreParams(weight=10.0, cap=100.0, decay=0.99),
        p5_behavior_penalty_weight=1.0,
        p5_behavior_penalty_decay=0.99,
        # py-libp2p charges 10 for a GRAFT within 10 s of a PRUNE that peer sent us ("graft
        # flood": both sides pruning and grafting in the same second when many peers join at once)
        # and 5 per IHAVE/IWANT spam event: up to 20 is forgiven (two such races), beyond it each
        # point counts. (A GRAFT during our backoff only renews the backoff: no penalty there.)
        p5_behavior_penalty_threshold=20.0,
        # P6: what the node learnt from the peer's bundles (refused groups, bad transfers).
        app_specific_score_fn=app_score,
        p6_appl_slack_weight=1.0,
        # P7 off: volunteers behind one NAT (and every sim on 127.0.0.1) share an address.
        p7_ip_colocation_weight=0.0,
        publish_threshold=-50.0,
        gossip_threshold=-20.0,
        graylist_threshold=-80.0,
        accept_px_threshold=0.0,
    )


@dataclass(frozen=True)
class GossipFigures:
    """Who a node gossips with, and what its upload budget held back (the round record's fields
    of the same names: learning/round_record.SwarmRoundStats)."""

    gossip_peers: int = 0  # peers with a pubsub stream
    mesh_peers: int = 0  # peers in this node's meshes
    lowest_gossip_score: float | None = None  # below -80 a peer is graylisted: nothing it sends is read
    forwards_withheld: int = 0  # others' announcements not passed on for want of upload budget, since start
    pulls_withheld: int = 0  # ... and not sent to a neighbour that asked for them by IWANT, since start
    serves_withheld: int = 0  # requests for our bundles answered "busy" under the user's cap, since start


def gossip_figures(pubsub, forwarding: UploadBudget | None = None,
                   serving: UploadBudget | None = None) -> GossipFigures:
    """Who a node gossips with: pubsub peers, mesh peers, and the lowest score among them (read
    from another thread than the network's: copies, and a read racing the scorer is skipped); and
    what its upload budgets held back since it started."""
    withheld = {"forwards_withheld": forwarding.withheld if forwarding else 0,
                "pulls_withheld": forwarding.pulls_withheld if forwarding else 0,
                "serves_withheld": serving.withheld if serving else 0}
    if pubsub is None:
        return GossipFigures(**withheld)
    router, peers = pubsub.router, list(pubsub.peers)  # read from another thread: copies
    topics = list(pubsub.topic_ids)
    scorer = getattr(router, "scorer", None)
    try:  # py-libp2p's scorer belongs to the network thread: a read racing it is skipped
        scores = [scorer.score(p, topics) for p in peers] if scorer is not None and topics else []
    except RuntimeError:
        scores = []
    return GossipFigures(gossip_peers=len(peers), mesh_peers=len({p for m in list(router.mesh.values()) for p in m}),
                         lowest_gossip_score=round(min(scores), 1) if scores else None, **withheld)

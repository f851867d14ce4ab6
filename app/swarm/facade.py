"""The node's one door to the swarm: what the round loop asks of it, whether or not there is a
network behind it.

Per round: `start_round()` (fetches start while the node generates) → the round shares its
groups through `sharer()` → `external_groups()` when the round samples its training set (bundles that arrived are
verified now) → `finish_round()` with what the update trained on (returns the round's swarm
figures). `OfflineSwarm` stands in when the swarm is off, so the node never asks which one it
has; it still verifies bundles dropped into its inbox (local tools and tests feed it that way).

Verification of peers' groups (inbox → intake → pool) is the same for both; networking (the
libp2p host, the announcement board, the bundle protocol) sits behind `network.Swarm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from ..config import Config
from ..errors import NodeError
from ..events import Listener, Notice, PeerView, SwarmHealth, SwarmUpdated
from ..learning.rollout import QuestionGroup, ShareCallback
from ..learning.round_record import SwarmRoundStats
from ..paths import Paths
from .verification.inbox import DrainReport, Inbox
from .verification.intake import IntakeContext
from .verification.pool import GroupPool

if TYPE_CHECKING:  # the network pulls in libp2p: imported only when the swarm is on
    from .network import SwarmNetwork


CUT_OFF_ROUNDS = 3  # rounds connected but outside every gossip mesh before the node says so


class OfflineSwarm:
    """No network: peers' groups come only through `inbox.offer()`."""

    name = ""
    peer_id = ""

    def __init__(self, emit: Listener, inbox: Inbox | None = None) -> None:
        self.emit = emit
        # Peers' bundles arrive here (from the network thread); rounds take J groups from its pool.
        self.inbox = inbox or Inbox(GroupPool())
        self._intakes: list[DrainReport] = []  # the round in flight's

    @property
    def listen_addrs(self) -> list[str]:
        return []

    # ---- per round -----------------------------------------------------------------------------
    def start_round(self, rng: np.random.Generator, config: Config, last_round_seconds: float | None) -> None:
        """A round begins: fetches start (within what `resources.bandwidth_kib_s` leaves over the
        last round's length), and forwarding takes the cap too (both live settings)."""
        self._intakes = []  # a dropped round's refusals are not the next one's

    def sharer(self, round_no: int, prefill: str) -> ShareCallback | None:
        """What the round calls with its scored groups; None: nobody to share with (no share phase)."""
        return None

    def external_groups(self, ctx: IntakeContext, wanted: bool, round_no: int) -> list[QuestionGroup]:
        """Verify what arrived so far, then offer the pool's fresh groups (when the round takes any)."""
        intake = self.inbox.drain(ctx, round_no)
        self._intakes.append(intake)
        for reason in intake.reasons:
            self.emit(Notice("warning", f"refused from a peer: {reason}"))
        self._blame(intake.by_peer)
        return self.inbox.pool.available(round_no) if wanted else []

    def finish_round(self, trained: Sequence[QuestionGroup], used_external: Sequence[QuestionGroup]) -> tuple[int, SwarmRoundStats | None]:
        """Used groups leave the pool; returns the round's refused groups and network figures."""
        self.inbox.pool.mark_used(used_external)
        intakes, self._intakes = self._intakes, []
        return sum(i.rejected for i in intakes), self._network_round(intakes, trained)

    # ---- what the network adds -----------------------------------------------------------------
    def _blame(self, refused_by_peer: dict[str, int]) -> None:
        pass

    def _network_round(self, intakes: list[DrainReport], trained: Sequence[QuestionGroup]) -> SwarmRoundStats | None:
        return None

    def announce_state(self) -> None:
        """Tell the viewers who is connected and how many bytes moved."""

    def health(self) -> SwarmHealth | None:
        """The libp2p host's state for `swarmling status`; None without a network."""
        return None

    def stop(self) -> None:
        pass


class OnlineSwarm(OfflineSwarm):
    """The same, with a libp2p host that fetches peers' bundles into the inbox and serves ours."""

    def __init__(self, emit: Listener, network: SwarmNetwork, inbox: Inbox) -> None:
        super().__init__(emit, inbox)
        self.network = network
        self.name = network.settings.name
        self.peer_id = network.peer_id
        self._alone: bool | None = None  # whether the last round had no peers, to say it once
        self._meshless_rounds = 0  # rounds in a row connected to peers but in no gossip mesh
        self._restarts_told = 0

    @property
    def listen_addrs(self) -> list[str]:
        return self.network.listen_addrs

    def start_round(self, rng: np.random.Generator, config: Config, last_round_seconds: float | None) -> None:
        super().start_round(rng, config, last_round_seconds)
        self.network.cap_upload(config.resources.bandwidth_kib_s)
        # fetches run on the network thread while we generate
        self.network.plan_fetches(rng, inbound_budget(config, last_round_seconds))

    def sharer(self, round_no: int, prefill: str) -> ShareCallback:
        return lambda groups: self.network.share(groups, round_no, prefill)

    def _blame(self, refused_by_peer: dict[str, int]) -> None:
        for peer, count in refused_by_peer.items():
            self.network.penalize(peer, count)

    def _network_round(self, intakes: list[DrainReport], trained: Sequence[QuestionGroup]) -> SwarmRoundStats:
        admitted: dict[str, int] = {}
        for intake in intakes:
            for peer, count in intake.admitted_by_peer.items():
                admitted[peer] = admitted.get(peer, 0) + count
        self.network.record_intake(admitted, trained)
        blamed = sum(count for intake in intakes for count in intake.by_peer.values())
        stats = msgspec.structs.replace(self.network.round_stats(), groups_blamed=blamed)
        self._say_if_alone(stats.peers)
        self._say_if_cut_off(stats)
        return stats

    def _say_if_alone(self, peers: int) -> None:
        alone = peers == 0
        if alone and self._alone is not True:
            self.emit(Notice("info", "no peers connected: training on local groups only (still looking for some)"))
        elif not alone and self._alone:
            self.emit(Notice("info", f"connected to {peers} peer(s)"))
        self._alone = alone

    def _say_if_cut_off(self, stats: SwarmRoundStats) -> None:
        """Connected, yet in no gossip mesh: announcements no longer reach this node (issue 41
        measured it under a slow-loris fetch attack: the mesh emptied while 15-40 peers stayed
        connected, and the node trained on no peer's group for 120 rounds without a word). Said
        once after CUT_OFF_ROUNDS such rounds, and again when it heals; `status` shows it."""
        was_cut_off = self._cut_off_rounds() > 0
        cut_off = stats.peers > 0 and stats.mesh_peers == 0
        self._meshless_rounds = self._meshless_rounds + 1 if cut_off else 0
        if self._meshless_rounds == CUT_OFF_ROUNDS:
            self.emit(Notice("warning", f"connected to {stats.peers} peer(s) but in no gossip mesh for {CUT_OFF_ROUNDS} "
                                        "rounds: peers' announcements are not reaching this node"))
        elif not cut_off and was_cut_off:
            self.emit(Notice("info", f"back in the gossip mesh ({stats.mesh_peers} peer(s))"))

    def _cut_off_rounds(self) -> int:
        """Rounds in a row outside every gossip mesh while connected, once it is worth saying (0: not)."""
        return self._meshless_rounds if self._meshless_rounds >= CUT_OFF_ROUNDS else 0

    def announce_state(self) -> None:
        bytes_in, bytes_out = self.network.totals()
        peers: tuple[PeerView, ...] = self.network.peer_views()
        health = self.network.health()
        if health.restarts > self._restarts_told:  # the round loop went on; the user hears it once
            self._restarts_told = health.restarts
            self.emit(Notice("warning", f"the swarm host failed and was restarted ({health.restarts} so far): "
                                        f"{health.last_error}"))
        reach = self.network.reachability()
        self.emit(SwarmUpdated(self.peer_id, tuple(self.network.announce_addrs()), peers, bytes_in, bytes_out,
                               health.restarts, health.last_error, reach.state, reach.describe()))

    def health(self) -> SwarmHealth:
        h = self.network.health()
        reach = self.network.reachability()
        return SwarmHealth(h.running, h.restarts, h.last_error, reach.state, reach.describe(), self._cut_off_rounds())

    def stop(self) -> None:
        self.network.stop()


SwarmOpener = Callable[[Config, Paths, str, Listener], OfflineSwarm]  # (config, paths, model, emit)


def inbound_budget(config: Config, last_round_seconds: float | None) -> int | None:
    """Bytes the next round may fetch: resources.bandwidth_kib_s over the last round's length
    (30 s before the first), if that is below swarm.inbound_kib_per_round; None: no cap set."""
    cap = config.resources.bandwidth_kib_s
    if cap is None:
        return None
    return min(config.swarm.inbound_kib_per_round, int(cap * (last_round_seconds or 30.0))) * 1024


def open_swarm(config: Config, paths: Paths, model_name: str, emit: Listener) -> OfflineSwarm:
    """The swarm the config asks for, started; errors the user can fix become NodeError."""
    sw = config.swarm
    if not sw.enabled:
        return OfflineSwarm(emit)
    from .host.host import SwarmError
    from .p2p.identity import IdentityError, load_or_create
    from .network import SwarmNetwork, SwarmSettings

    inbox = Inbox(GroupPool())
    try:
        identity = load_or_create(paths.data_dir)
        network = SwarmNetwork(
            SwarmSettings(
                name=sw.name,
                listen_host=sw.listen_host,
                port=sw.port,
                bootstrap=sw.bootstrap,
                peers=sw.peers,
                mdns=sw.mdns,
                inbound_budget_bytes=sw.inbound_kib_per_round * 1024,
            ),
            identity,
            inbox,
            paths.data_dir,
            model_name,
        )
        network.start()
    except IdentityError as exc:
        raise NodeError(str(exc)) from None
    except ValueError as exc:  # a bootstrap / peer address that does not parse
        raise NodeError(f"[swarm] {exc}") from None
    except SwarmError as exc:
        raise NodeError(
            f"{exc}. Another program (or swarmling node) may hold port {sw.port}: pick another with "
            "--port, --set swarm.port=0 for any free port, or run alone with --set swarm.enabled=false"
        ) from None
    swarm = OnlineSwarm(emit, network, inbox)
    emit(Notice("info", f"swarm {sw.name!r}: peer {identity.peer_id}, listening on {', '.join(swarm.listen_addrs)}"))
    return swarm

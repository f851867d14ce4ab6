"""The node's door to the swarm, on a stand-in network: what the round loop gets and what the
viewers are told (the real network side is tested on libp2p hosts in test_swarm_network.py)."""

from __future__ import annotations

from types import SimpleNamespace

from swarmling.app.events import Notice, SwarmHealth, SwarmUpdated
from swarmling.app.learning.round_record import SwarmRoundStats
from swarmling.app.swarm.facade import OfflineSwarm, OnlineSwarm
from swarmling.app.swarm.host.supervision import HostHealth
from swarmling.app.swarm.nat.reachability import Reachability


class StandInNetwork:
    def __init__(self) -> None:
        self.settings = SimpleNamespace(name="test")
        self.peer_id = "12D3KooWStandIn"
        self.listen_addrs = ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWStandIn"]
        self.penalized: dict[str, int] = {}
        self.shared: list = []
        self.restarts, self.last_error = 0, ""

    def health(self) -> HostHealth:
        return HostHealth(running=True, restarts=self.restarts, last_error=self.last_error)

    def reachability(self) -> Reachability:
        return Reachability("relayed", relay_addrs=(f"/ip4/198.18.0.10/tcp/1/p2p/12D3KooWHelper/p2p-circuit/p2p/{self.peer_id}",),
                            helpers=("12D3KooWHelper",))

    def announce_addrs(self) -> list[str]:
        return [*self.reachability().relay_addrs, *self.listen_addrs]

    def totals(self):
        return 10, 20

    def peer_views(self):
        return ()

    def penalize(self, peer: str, count: int = 1) -> None:
        self.penalized[peer] = self.penalized.get(peer, 0) + count

    def share(self, groups, round_no, prefill) -> None:
        self.shared.append((round_no, prefill))

    def record_intake(self, admitted, used) -> None:
        pass

    def round_stats(self) -> SwarmRoundStats:
        return SwarmRoundStats(peers=0, host_restarts=self.restarts)


def test_offline_the_round_has_no_share_phase_and_no_network_figures():
    swarm = OfflineSwarm(lambda event: None)
    assert swarm.sharer(1, "<answer>") is None and swarm.health() is None
    assert swarm.finish_round([], []) == (0, None)


def test_a_restarted_host_is_told_once_and_shows_in_status_and_the_swarm_view():
    events, network = [], StandInNetwork()
    swarm = OnlineSwarm(events.append, network, OfflineSwarm(lambda e: None).inbox)
    swarm.announce_state()
    network.restarts, network.last_error = 1, "DecodeError: Error parsing message"
    swarm.announce_state()
    swarm.announce_state()
    warnings = [e.text for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert len(warnings) == 1 and "restarted (1 so far): DecodeError" in warnings[0]
    last = [e for e in events if isinstance(e, SwarmUpdated)][-1]
    assert (last.host_restarts, last.host_error) == (1, "DecodeError: Error parsing message")
    assert swarm.health() == SwarmHealth(running=True, restarts=1, last_error="DecodeError: Error parsing message",
                                         reachability="relayed", reachability_text="through relay oWHelper",
                                         cut_off_rounds=0)
    _, stats = swarm.finish_round([], [])
    assert stats.host_restarts == 1 and stats.peers == 0


def test_the_swarm_view_shows_where_peers_reach_us():
    events, network = [], StandInNetwork()
    OnlineSwarm(events.append, network, OfflineSwarm(lambda e: None).inbox).announce_state()
    update = [e for e in events if isinstance(e, SwarmUpdated)][-1]
    assert update.reachability == "relayed" and update.reachability_text == "through relay oWHelper"
    assert update.listen_addrs[0].endswith(f"/p2p-circuit/p2p/{network.peer_id}")  # "dial me at": the relayed one


def test_sharing_goes_to_the_network():
    network = StandInNetwork()
    swarm = OnlineSwarm(lambda e: None, network, OfflineSwarm(lambda e: None).inbox)
    swarm.sharer(3, "<answer>")([])
    assert network.shared == [(3, "<answer>")]


def test_a_node_connected_but_in_no_gossip_mesh_says_so_once_and_again_when_it_heals():
    """Issue 41's victim: peers connected, the mesh empty, announcements frozen, and not a word."""
    from swarmling.app.swarm.facade import CUT_OFF_ROUNDS

    events, network = [], StandInNetwork()
    swarm = OnlineSwarm(events.append, network, OfflineSwarm(lambda e: None).inbox)
    meshes = [4] + [0] * (CUT_OFF_ROUNDS + 2) + [3]
    for mesh in meshes:
        network.round_stats = lambda mesh=mesh: SwarmRoundStats(peers=15, gossip_peers=12, mesh_peers=mesh)
        swarm.finish_round([], [])
        if mesh == 0 and swarm.health().cut_off_rounds:
            assert swarm.health().cut_off_rounds >= CUT_OFF_ROUNDS
    texts = [e.text for e in events if isinstance(e, Notice)]
    warnings = [t for t in texts if "in no gossip mesh" in t]
    assert len(warnings) == 1 and "connected to 15 peer(s)" in warnings[0]
    assert texts[-1] == "back in the gossip mesh (3 peer(s))" and swarm.health().cut_off_rounds == 0

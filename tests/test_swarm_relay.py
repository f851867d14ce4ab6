"""The relay's pure parts: circuit addresses, what a node announces, in which order a fetch dials
an author, who is blamed when it fails, and the bound on uploads through a helper. The real thing
(helpers, NATs, py-libp2p's relay) is tested in the namespace lab: test_netlab_relay.py."""

from __future__ import annotations

from collections import deque

import trio
from libp2p.peer.id import ID

from swarmling.app.swarm.bundle_protocol import NO_ROUTE, NOT_THE_PEERS_FAULT, BundleExchange, RelayedServes
from swarmling.app.swarm.dialer import DialCooldown
from swarmling.app.swarm.host import HostSettings, SwarmHost
from swarmling.app.swarm.identity import new_identity
from swarmling.app.swarm.reachability import Reachability
from swarmling.app.swarm.relay import circuit_addr, is_circuit, relay_of

HELPER = "12D3KooWJFsZq7RUVzvjTkSAbMLhaniVx4fCR4fy9R58qHRcmGfV"
AUTHOR = "12D3KooWC4inuF1cvKLS1HvjbdsgKobjv1S3ypSoLkhRc3i5bMN3"
HELPER_ADDR = f"/ip4/198.18.0.10/tcp/4001/p2p/{HELPER}"
CIRCUIT = circuit_addr(HELPER_ADDR, AUTHOR)
LAN = f"/ip4/100.64.1.2/tcp/4001/p2p/{AUTHOR}"


def test_a_circuit_address_names_the_helper_and_the_peer():
    assert CIRCUIT == f"{HELPER_ADDR}/p2p-circuit/p2p/{AUTHOR}"
    assert is_circuit(CIRCUIT) and not is_circuit(LAN)
    assert relay_of(CIRCUIT) == HELPER and relay_of(LAN) == ""


def test_the_verdict_in_a_volunteers_words():
    assert Reachability("direct", public_addr=f"/ip4/198.18.1.1/tcp/4001/p2p/{AUTHOR}").describe() == \
        "reachable directly at /ip4/198.18.1.1/tcp/4001"
    assert Reachability("relayed", helpers=(HELPER,)).describe() == f"through relay {HELPER[-8:]}"
    assert Reachability("unreachable").describe() == "not reachable: peers cannot fetch your rollouts"
    assert Reachability().describe().startswith("not checked: no helper connected")


def test_a_node_announces_where_peers_reach_it_first(tmp_path):
    identity = new_identity(tmp_path)
    host = SwarmHost(HostSettings("t", 1, "0.0.0.0", 0), identity.key_pair, lambda o, d: True, lambda d: None,
                     lambda *a: None)
    host.listen_addrs = [LAN]
    assert host.announce_addrs() == [LAN]  # no verdict yet: the interfaces, as before
    host._reachability.set(Reachability("relayed", relay_addrs=(CIRCUIT,), helpers=(HELPER,)))
    assert host.announce_addrs() == [CIRCUIT, LAN]
    public = f"/ip4/198.18.1.1/tcp/4001/p2p/{AUTHOR}"
    host._reachability.set(Reachability("direct", public_addr=public, helpers=(HELPER,)))
    assert host.announce_addrs() == [public, LAN]
    host._reachability.set(Reachability("unreachable", helpers=(HELPER,)))
    assert host.announce_addrs() == [LAN]


class FakeHost:
    """Connections and dials as BundleExchange sees them; every dial fails."""

    def __init__(self, connected: tuple[str, ...] = ()) -> None:
        self.connected = [ID.from_base58(p) for p in connected]
        self.dialled: list[str] = []

    def get_connected_peers(self):
        return list(self.connected)

    async def connect(self, info) -> None:
        self.dialled.append(str(info.addrs[0]))
        raise ConnectionError("no route")


def exchange(host: FakeHost, cooldown: DialCooldown) -> BundleExchange:
    async def dial_circuit(addr: str) -> None:
        host.dialled.append(addr)
        raise ConnectionError("relay refused")

    return BundleExchange(host, "/p", 5.0, lambda d: None, lambda *a: None, deque(), lambda p: False, cooldown,
                          dial_circuit=dial_circuit)


def test_an_author_with_relay_slots_is_dialled_through_them_and_blamed_only_when_its_helper_is_up():
    # helper connected: the circuit failing is the author's doing (its slot is gone, or it is)
    host, cooldown = FakeHost(connected=(HELPER,)), DialCooldown()
    why = trio.run(exchange(host, cooldown)._dial, AUTHOR, ID.from_base58(AUTHOR), (CIRCUIT, LAN))
    assert host.dialled == [CIRCUIT]  # its LAN address is for its LAN's peers (mDNS)
    assert why.startswith("dial failed") and why not in NOT_THE_PEERS_FAULT and cooldown.blocked(AUTHOR)
    # helper gone (restarting): nobody's fault, no cooldown, so trading resumes when it is back
    host, cooldown = FakeHost(), DialCooldown()
    why = trio.run(exchange(host, cooldown)._dial, AUTHOR, ID.from_base58(AUTHOR), (CIRCUIT, LAN))
    assert why == NO_ROUTE and why in NOT_THE_PEERS_FAULT and not cooldown.blocked(AUTHOR)


def test_an_author_without_relay_slots_is_dialled_at_its_addresses_in_order():
    host, cooldown = FakeHost(), DialCooldown()
    second = f"/ip4/100.64.1.3/tcp/4001/p2p/{AUTHOR}"
    trio.run(exchange(host, cooldown)._dial, AUTHOR, ID.from_base58(AUTHOR), (LAN, second))
    assert [a.split("/p2p/")[0] for a in host.dialled] == [LAN.split("/p2p/")[0], second.split("/p2p/")[0]]
    assert cooldown.blocked(AUTHOR)


def test_uploads_through_a_relay_are_bounded_per_window():
    now = [0.0]
    serves = RelayedServes(limit=3, window_s=60.0, clock=lambda: now[0])
    assert [serves.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 30.0
    assert not serves.take()
    now[0] = 61.0  # the first three left the window
    assert serves.take() and serves.refused == 2

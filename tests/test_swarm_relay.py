"""The relay's pure parts: circuit addresses, what a node announces, in which order a fetch dials
an author, who is blamed when it fails, the bound on uploads through a helper, and the py-libp2p
internals we override. The real thing (helpers, NATs, py-libp2p's relay) is tested in the
namespace lab: test_netlab_relay.py."""

from __future__ import annotations

import ipaddress

import trio
from libp2p.peer.id import ID

from swarmling.app.swarm.host.bundle_protocol import FetchOutcome, RelayedServes
from swarmling.app.swarm.host.dialer import AuthorDialer, DialCooldown
from swarmling.app.swarm.host.host import HostSettings, SwarmHost
from swarmling.app.swarm.nat.reachability import Reachability, ask_dialback, routable
from swarmling.app.swarm.nat.relay import circuit_addr, is_circuit, relay_of
from swarmling.app.swarm.p2p.identity import new_identity

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
    """Connections and dials as AuthorDialer sees them; every dial fails."""

    def __init__(self, connected: tuple[str, ...] = ()) -> None:
        self.connected = [ID.from_base58(p) for p in connected]
        self.dialled: list[str] = []

    def get_connected_peers(self):
        return list(self.connected)

    async def connect(self, info) -> None:
        self.dialled.append(str(info.addrs[0]))
        raise ConnectionError("no route")


def author_dialer(host: FakeHost, cooldown: DialCooldown) -> AuthorDialer:
    async def dial_circuit(addr: str) -> None:
        host.dialled.append(addr)
        raise ConnectionError("relay refused")

    # as seen from a machine on the author's LAN (100.64.1.0/24): its LAN addresses are within reach
    return AuthorDialer(host, cooldown, dial_circuit=dial_circuit, networks=lambda: [ipaddress.ip_network("100.64.1.0/24")])


def test_an_author_with_relay_slots_is_dialled_through_them_and_blamed_only_when_its_helper_is_up():
    # helper connected: the circuit failing is the author's doing (its slot is gone, or it is)
    host, cooldown = FakeHost(connected=(HELPER,)), DialCooldown()
    outcome, why = trio.run(author_dialer(host, cooldown).dial, AUTHOR, ID.from_base58(AUTHOR), (CIRCUIT, LAN))
    assert host.dialled == [CIRCUIT]  # its LAN address is for its LAN's peers (mDNS)
    assert why.startswith("dial failed") and outcome.blames_peer and cooldown.blocked(AUTHOR)
    # helper gone (restarting): nobody's fault, no cooldown, so trading resumes when it is back
    host, cooldown = FakeHost(), DialCooldown()
    outcome, why = trio.run(author_dialer(host, cooldown).dial, AUTHOR, ID.from_base58(AUTHOR), (CIRCUIT, LAN))
    assert outcome is FetchOutcome.NO_ROUTE and why == FetchOutcome.NO_ROUTE.value and not outcome.blames_peer \
        and not cooldown.blocked(AUTHOR)


def test_an_author_without_relay_slots_is_dialled_at_its_addresses_in_order():
    host, cooldown = FakeHost(), DialCooldown()
    second = f"/ip4/100.64.1.3/tcp/4001/p2p/{AUTHOR}"
    trio.run(author_dialer(host, cooldown).dial, AUTHOR, ID.from_base58(AUTHOR), (LAN, second))
    assert [a.split("/p2p/")[0] for a in host.dialled] == [LAN.split("/p2p/")[0], second.split("/p2p/")[0]]
    assert cooldown.blocked(AUTHOR)


def test_another_homes_lan_address_is_not_dialled_nor_held_against_the_author():
    # what a node behind NAT announces until a helper gives it a slot (as while a restarted helper
    # comes back): dialling it from another home only waited for a timeout, then cooled the author down
    host, cooldown = FakeHost(), DialCooldown()
    elsewhere = AuthorDialer(host, cooldown, networks=lambda: [ipaddress.ip_network("100.64.2.0/24")])
    outcome, _ = trio.run(elsewhere.dial, AUTHOR, ID.from_base58(AUTHOR), (LAN,))
    assert outcome is FetchOutcome.NO_ROUTE and host.dialled == [] and not cooldown.blocked(AUTHOR)
    public = f"/ip4/198.18.1.1/tcp/4001/p2p/{AUTHOR}"  # a public address is dialled (and blamed) as before
    outcome, _ = trio.run(elsewhere.dial, AUTHOR, ID.from_base58(AUTHOR), (LAN, public))
    assert host.dialled == [public.split("/p2p/")[0]] and outcome.blames_peer and cooldown.blocked(AUTHOR)


def test_uploads_through_a_relay_are_bounded_per_window_in_all_and_per_peer():
    # (a node's own relayed serves are bounded in all only: one peer's share is each bundle once)
    now = [0.0]
    serves = RelayedServes(limit=3, per_peer=2, window_s=60.0, clock=lambda: now[0])
    assert [serves.take("a"), serves.take("a"), serves.take("a")] == [True, True, False]  # a's share
    assert [serves.take("b"), serves.take("c")] == [True, False]  # all three taken
    now[0] = 30.0
    assert not serves.take("d")
    now[0] = 61.0  # the first three left the window
    assert serves.take("a") and serves.refused == 3


class FakeStream:
    def __init__(self, reply: bytes) -> None:
        self.reply, self.written = reply, b""

    async def write(self, data: bytes) -> None:
        self.written += data

    async def read(self, n: int) -> bytes:
        chunk, self.reply = self.reply[:n], self.reply[n:]
        return chunk

    async def close(self) -> None:
        pass


class DialBackHost:
    def __init__(self, reply: bytes) -> None:
        self.stream = FakeStream(reply)

    async def new_stream(self, peer, protocols):
        return self.stream


def test_only_a_dial_back_answer_about_our_own_port_is_believed():
    def ask(reply: bytes):
        host = DialBackHost(reply)
        answer = trio.run(ask_dialback, host, "/swarmling/t/1/dialback", HELPER, 4001)
        assert host.stream.written == b"4001\n"
        return answer

    assert ask(b"ok /ip4/198.18.1.1/tcp/4001\n") == ("ok", "/ip4/198.18.1.1/tcp/4001")
    assert ask(b"no /ip4/198.18.1.1/tcp/4001\n") == ("no", "")
    assert ask(b"ok /ip4/203.0.113.9/tcp/9999\n") == ("busy", "")  # not our port: a liar's address
    assert ask(b"ok /dns4/evil.example/tcp/4001\n") == ("busy", "")
    assert ask(b"busy\n") == ("busy", "")


def test_a_helper_calls_public_only_what_peers_elsewhere_can_reach():
    assert routable("203.0.113.7") is False  # documentation range: not global
    assert routable("8.8.8.8") and routable("198.18.1.1")  # a public address; the lab's internet
    assert not any(routable(ip) for ip in ("192.168.1.20", "10.0.0.5", "100.64.1.2", "127.0.0.1", "nonsense"))


def test_a_helper_frees_the_slots_of_nodes_that_left(tmp_path):
    from libp2p.relay.circuit_v2.resources import RelayLimits

    from swarmling.app.swarm.nat.relay import CountingRelay

    relay = CountingRelay(SimpleHost(), RelayLimits(60, 1 << 20, 2, 8), allow_hop=True)
    stayed, left = ID.from_base58(HELPER), ID.from_base58(AUTHOR)
    relay.resource_manager.reserve(stayed)
    relay.resource_manager.reserve(left)
    assert relay.reservations() == 2 and relay.holds_slot(AUTHOR)
    assert relay.drop_departed({stayed}) == 1
    assert relay.reservations() == 1 and not relay.holds_slot(AUTHOR) and relay.holds_slot(HELPER)


class SimpleHost:
    """What py-libp2p's relay resource manager asks of its host (it signs vouchers with the key)."""

    def __init__(self) -> None:
        from libp2p.crypto.ed25519 import create_new_key_pair
        from libp2p.peer.peerstore import PeerStore

        self.key_pair = create_new_key_pair()
        self._peerstore = PeerStore()

    def get_id(self):
        return ID.from_pubkey(self.key_pair.public_key)

    def get_peerstore(self):
        return self._peerstore

    def get_private_key(self):
        return self.key_pair.private_key

    def get_public_key(self):
        return self.key_pair.public_key


def test_a_circuit_that_is_slow_to_open_is_held_against_nobody(monkeypatch):
    import swarmling.app.swarm.host.dialer as dialer

    monkeypatch.setattr(dialer, "CIRCUIT_DIAL_TIMEOUT_S", 0.05)
    host, cooldown = FakeHost(connected=(HELPER,)), DialCooldown()
    authors = author_dialer(host, cooldown)

    async def hangs(addr: str) -> None:
        await trio.sleep(10)

    authors._dial_circuit = hangs
    outcome, why = trio.run(authors.dial, AUTHOR, ID.from_base58(AUTHOR), (CIRCUIT,))
    assert outcome is FetchOutcome.SLOW_CIRCUIT and why == FetchOutcome.SLOW_CIRCUIT.value and not outcome.blames_peer \
        and not cooldown.blocked(AUTHOR)


def test_the_py_libp2p_internals_the_relay_and_the_pubsub_guard_override_are_still_there():
    # relay.py and pubsub_guard.py override private methods of py-libp2p 0.8.1 (their docstrings
    # say why). A py-libp2p that renamed or reshaped them would silently bypass our limits: say so here.
    import inspect

    from libp2p.host.basic_host import BasicHost
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
    from libp2p.relay.circuit_v2.transport import CircuitV2Transport

    def params(cls, name: str) -> list[str]:
        return list(inspect.signature(getattr(cls, name)).parameters)

    assert params(CircuitV2Protocol, "_handle_reserve") == ["self", "stream", "msg"]
    assert params(CircuitV2Protocol, "_handle_connect") == ["self", "stream", "msg"]
    assert params(CircuitV2Protocol, "_handle_stop_stream") == ["self", "stream"]
    assert params(CircuitV2Protocol, "_relay_data")[:4] == ["self", "src_stream", "dst_stream", "peer_id"]
    assert params(CircuitV2Protocol, "_read_stream_with_retry")[:2] == ["self", "stream"]
    assert {"_send_status", "_close_stream"} <= set(dir(CircuitV2Protocol))
    assert "self._active_relays" in inspect.getsource(CircuitV2Protocol)  # replaced by relay._Forgetful
    assert {"_make_reservation", "_dial_via_circuit_addr", "parse_circuit_ma"} <= set(dir(CircuitV2Transport))
    assert "upgrade_outbound_connection" in dir(BasicHost)
    assert params(Pubsub, "_handle_new_peer") == ["self", "peer_id"]
    assert params(Pubsub, "push_msg") == ["self", "msg_forwarder", "msg"]
    # IgnoredMessage leaves push_msg unscored only while validation failures are caught as ValidationError
    assert "except ValidationError" in inspect.getsource(Pubsub.push_msg)

"""The node's libp2p host: Noise-only TCP, GossipSub for announcements, bundles on their own protocol.

`SwarmHost` puts the pieces together: it runs on its own trio thread (trio_bridge.py), keeps its
peers connected (dialer.py) and only the useful ones (admission.py), exchanges bundles
(bundle_protocol.py), counts bytes on the wire (counting_transport.py), and here builds the
libp2p host and its pubsub. The round loop calls its thread-safe, non-blocking methods
(`publish`, `fetch`, `connected_peers`, `connected_addrs`, `health`) and reads `counters`; what
arrives is handed back through callbacks that only touch thread-safe structures (the
announcement board and the inbox).

The host is a supervised service: whatever escapes one of py-libp2p's services (pubsub,
gossipsub, identify, the bundle protocol, the dialler) is logged with its root cause, the host is
torn down and started again on the same port after a backoff (supervision.py), and `health()`
says so; the round loop never waits on it. Queued publishes and fetches survive a restart.

py-libp2p 0.8.1's sharp edges, and what this module does about each:
- the default host also accepts `/plaintext/2.0.0` (peer-ID impersonation): Noise is the only
  security transport offered or accepted;
- `connect()` deadlocks if Pubsub/GossipSub are built but not started: both run before any dial;
- GossipSub's heartbeat defaults to 120 s: 1 s; its "adaptive gossip" then turns that into 30-60 s:
  off (gossip_router.py, where it is built);
- its mesh pruning and backoffs kept two honest peers apart while identities crowded in: mesh.py;
- its spam protection also throttles our own publishes: off, per-origin limits live in the
  topic validator (`gossip_validator`), which runs before anything is relayed;
- `publish()` drops silently when a peer's 32-slot queue is full: publishes are paced;
- messages of 1 MiB or more vanish: gossip carries small announcements, bundles travel on a
  request/response stream with its own size cap;
- peer scoring ships off, and its P4 weight has the opposite sign to go-libp2p's: configured
  here explicitly (positive weights are penalties);
- one malformed pubsub message could stop the Pubsub service: pubsub_guard.py;
- validators can only accept or reject, and every rejection counts against the forwarder, whose
  mesh traffic stops once its score is under the gossip threshold (-20): what the forwarder may
  rightly have let through (a burst over an origin's rate, a re-announcement) is ignored instead
  (board.py's `Verdict`, pubsub_guard.py's `IgnoredMessage`);
- identify advertises the wildcard listen address and peers store it in place of the one they
  dialled (then dial themselves): our advertised addresses never hold a wildcard, and the
  peerstore keeps only dialable ones (peerstore.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from ..nat.reachability import DialBackServer, Reachability, ReachabilityBoard, dialback_protocol, keep_reachable
from ..nat.relay import (HELPER_LIMITS, NODE_LIMITS, CountingRelay, RelayClient, free_departed_slots, is_circuit,
                         relay_figures)
from ..p2p.addresses import dialable_addrs, interface_hosts, is_loopback
from ..p2p.counting_transport import Counters, CountingTCP
from ..p2p.identity import peer_id_of
from ..p2p.peerstore import DialablePeerstore
from ..p2p.trio_bridge import TrioThread
from ..verification.board import Verdict
from .admission import KEEP_AT_MOST, ConnectionKeeper, Rank, free_inbound_slots_on_close
from .bundle_protocol import BundleExchange, BundleSource, FetchDone, FetchOutcome, with_words
from .dialer import AuthorDialer, DialCooldown, Dialer, parse_peer_addr
from .gossip_router import GOSSIPSUB_PROTOCOL, GossipFigures, gossip_figures, gossip_router
from .forwarding import FORWARD_KIB_S, UploadBudget, serving_budget
from .keep_policy import KeepPolicy
from .publishing import Publisher
from .thanks import Thanks, thanks_protocol
from .pubsub_guard import GuardedPubsub, IgnoredMessage
from .shard_topics import ShardTopics
from .supervision import HealthBoard, HostHealth, RestartBackoff, describe

# The names other modules import from here; the address helpers and parse_peer_addr live next door.
__all__ = ["GOSSIPSUB_PROTOCOL", "HostHealth", "HostSettings", "SwarmError", "SwarmHost", "interface_hosts", "parse_peer_addr"]

log = logging.getLogger("swarmling.swarm")
# Importing py-libp2p resets its logger (WARNING, no handler, not propagated), so Python's last-resort
# handler printed its ERRORs bare on stderr: a line for every failed dial of a helper that is down.
# The CLI's choice comes back here: py-libp2p's own account only with --verbose.
_root_level = logging.getLogger().level
logging.getLogger("libp2p").setLevel(_root_level if _root_level <= logging.INFO else logging.CRITICAL)

# Connections are bounded whatever the swarm's size; py-libp2p's auto-connector (which dials every
# address in the peerstore, ephemeral ports included, whenever fewer than 100 are open) is off:
# the dialer decides whom to dial. Whom to keep is admission.py's (it keeps far fewer than this
# hard cap, so newcomers find room); py-libp2p's own pruner is left idle (high watermark = cap):
# it never closes a connection with a stream open, and every pubsub peer has one.
CONNECTIONS = ConnectionConfig(max_connections=96, high_watermark=96, low_watermark=0, min_connections=0,
                               max_connections_per_peer=2)
# A helper is every node's first contact: it keeps more, and never drops a node holding a relay slot.
HELPER_CONNECTIONS = ConnectionConfig(max_connections=256, high_watermark=256, low_watermark=0, min_connections=0,
                                      max_connections_per_peer=2)
HELPER_KEEPS = 224
PUBLISH_QUEUE, FETCH_QUEUE, THANKS_QUEUE = 64, 256, 64  # items waiting for the trio thread; more are dropped


class SwarmError(RuntimeError):
    """The host could not start (port taken, bad address); the message says what to change."""


@dataclass(frozen=True)
class HostSettings:
    swarm: str  # topics and protocols are namespaced by this and the protocol version
    version: int
    listen_host: str
    port: int
    dial: tuple[str, ...] = ()  # bootstrap, static and remembered peers: /ip4/…/tcp/…/p2p/<id>
    named: int = 0  # the first `named` of `dial` are the user's bootstrap and static peers
    mdns: bool = False
    publish_interval_s: float = 0.05
    fetch_timeout_s: float = 20.0  # a bundle is ≤ 512 KiB: a peer slower than this is as good as gone
    # A helper (`swarmling relay`): relays circuits for nodes behind NAT and dials them back to say
    # whether they are reachable, instead of reserving slots itself.
    helper: bool = False
    forward_kib_s: float = FORWARD_KIB_S  # a node's upload for forwarding others' announcements

    @property
    def topic(self) -> str:
        return f"/swarmling/{self.swarm}/{self.version}/announce"

    @property
    def fetch_protocol(self) -> TProtocol:
        return TProtocol(f"/swarmling/{self.swarm}/{self.version}/bundle")

    @property
    def dialback_protocol(self) -> TProtocol:
        return dialback_protocol(self.swarm, self.version)

    @property
    def thanks_protocol(self) -> TProtocol:
        return thanks_protocol(self.swarm, self.version)


GossipValidator = Callable[[str, bytes], Verdict | bool]  # (origin peer id, data) -> accept?


class SwarmHost:
    def __init__(
        self,
        settings: HostSettings,
        key_pair: KeyPair,
        gossip_validator: GossipValidator,
        serve_bundle: BundleSource,
        on_fetched: FetchDone,
        app_score: Callable[[str], float] = lambda peer: 0.0,
        keeps_peer: Callable[[str], bool] = lambda peer: False,
        peer_rank: Rank = lambda peer: (False, 0.0),
        on_served: Callable[[str], None] = lambda peer: None,
        on_thanked: Callable[[str, int], None] = lambda peer, groups: None,
    ) -> None:
        self.settings = settings
        self.key_pair = key_pair
        self.peer_id = peer_id_of(key_pair)
        self._validate = gossip_validator
        self._serve = serve_bundle
        self._on_fetched = on_fetched
        self._on_served = on_served  # a peer fetched one of our bundles whole (swarm/given.py)
        self._on_thanked = on_thanked  # a peer says it trained on our groups (thanks.py)
        self._app_score = app_score
        self._peer_rank = peer_rank
        self.counters = Counters()
        self.listen_addrs: list[str] = []
        self.fetch_latency_s: deque[float] = deque(maxlen=64)  # recent successful fetches (bounded: hours of rounds)
        self._trio = TrioThread("swarmling-libp2p", self._main)
        self._dialer = Dialer(self.peer_id)
        self.cooldown = DialCooldown()  # bundle authors we could not dial lately
        self._keep = KeepPolicy(self._dialer, keeps_peer, lambda: (self._host, self._pubsub, self._relay))
        self._keeper = ConnectionKeeper(self._keep.never_dropped, peer_rank,
                                        keep_at_most=HELPER_KEEPS if settings.helper else KEEP_AT_MOST)
        # One life of the libp2p host's parts (set by _run_host, replaced on a restart)
        self._host = self._pubsub = self._bundles = None
        self.thanks: Thanks | None = None  # telling authors we trained on their groups (thanks.py)
        # The trio thread's queues (trio.MemorySendChannel), set once it runs: publish, fetch, thanks
        self._publish_send = self._fetch_send = self._thanks_send = None
        self._health = HealthBoard()
        self.shards = ShardTopics(settings.topic, self.peer_id, self._gossip_validator)  # announcement topics (shards.py)
        self._reachability = ReachabilityBoard()
        self._relay: CountingRelay | None = None
        self._dialback: DialBackServer | None = None
        self._bound_port = 0  # the port the first start got (settings may say 0): restarts keep it
        self._publisher = Publisher(settings.topic, self.shards, self._dialer)
        # Forwarding others' announcements within an upload budget (forwarding.py); a helper forwards freely.
        self.forwarding = None if settings.helper else UploadBudget(settings.forward_kib_s)
        self.serving = serving_budget()  # our bundles: under the user's upload cap, if any

    # ---- thread-safe API ---------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        self._dialer.add_targets(self.settings.dial, self.settings.named)
        if not self._trio.start(timeout_s):
            raise SwarmError(f"the libp2p host did not start within {timeout_s:.0f} s")
        if self._trio.start_error is not None:
            raise SwarmError(f"could not start the swarm host on port {self.settings.port}: {self._trio.start_error}") from None

    def stop(self, timeout_s: float = 10.0) -> None:
        self._trio.stop(timeout_s)

    def publish(self, data: bytes) -> bool:
        """Queue an announcement; False when the host is not running (a full queue drops it, logged)."""
        return self._trio.send_nowait(self._publish_send, data)

    def fetch(self, peer: str, digest: str, max_bytes: int, addrs: tuple[str, ...] = ()) -> bool:
        """Fetch a bundle by digest from the peer that announced it; the result goes to `on_fetched`."""
        return self._trio.send_nowait(self._fetch_send, (peer, digest, max_bytes, addrs))

    def thank(self, peer: str, groups: int) -> bool:
        """Tell a connected author we trained on `groups` of its groups (thanks.py); False when
        the host is not running or the queue is full (dropped: it is only a courtesy)."""
        return self._trio.send_nowait(self._thanks_send, (peer, groups))

    def meet(self, addr: str) -> None:
        """Dial this peer and keep it connected (a shard mate, shards.py); ValueError on a bad address."""
        self._dialer.discovered(parse_peer_addr(addr))

    def connected_peers(self) -> list[str]:
        return self._dialer.connected_peers()

    def connected_addrs(self) -> list[str]:
        """Dialable addresses of connected peers that we reached by dialling."""
        return self._dialer.connected_addrs()

    def health(self) -> HostHealth:
        """Whether the host runs now, how often it was restarted, and the last failure's cause."""
        return self._health.snapshot()

    def reachability(self) -> Reachability:
        """Whether peers can dial us: directly, through a helper's relay, or not (reachability.py)."""
        return self._reachability.get()

    def announce_addrs(self) -> list[str]:
        """Where peers should reach us, best first: the public address a helper dialled us at, else
        our slots on helpers, then the interface addresses (peers on the same network)."""
        now = self._reachability.get()
        first = [now.public_addr] if now.state == "direct" else list(now.relay_addrs) if now.state == "relayed" else []
        return list(dict.fromkeys([*first, *self.listen_addrs]))

    def gossip_figures(self) -> GossipFigures:
        return gossip_figures(self._pubsub, self.forwarding, self.serving)

    def connection_figures(self) -> dict[str, int]:
        """Connections held now, by the first reason each is kept (keep_policy.py)."""
        held: dict[str, int] = {}
        for peer in self._dialer.connected_peers():
            why = self._keep.reason(peer, self._bundles)
            held[why] = held.get(why, 0) + 1
        return held

    def relay_figures(self) -> dict:
        """A helper's relay: slots held, circuits open, bytes copied, dial-backs answered."""
        return relay_figures(self._relay, self._dialback)

    # ---- the trio side -----------------------------------------------------------------------
    async def _main(self) -> None:
        """Run the host, supervised: when py-libp2p fails, log why, tear it down, start it again."""
        publish_send, publish_recv = trio.open_memory_channel(PUBLISH_QUEUE)
        fetch_send, fetch_recv = trio.open_memory_channel(FETCH_QUEUE)
        thanks_send, thanks_recv = trio.open_memory_channel(THANKS_QUEUE)
        backoff = RestartBackoff()
        port = self.settings.port
        try:
            while True:
                started = trio.current_time()
                try:
                    await self._run_host(port, publish_recv, fetch_recv, thanks_recv,
                                         (publish_send, fetch_send, thanks_send))
                    return  # stopped on request
                except Exception as exc:  # noqa: BLE001 — any service's failure: restart, never give up
                    if not self._trio.is_ready:
                        raise  # the first start: the caller says what to change (port taken, …)
                    cause = describe(exc)
                    delay = backoff.next_delay(trio.current_time() - started)
                    self._health.down(cause, restarting=True)
                    log.error("swarm host failed (%s); restarting it in %.0f s", cause, delay, exc_info=exc)
                port = self._bound_port or port  # peers remember our address: keep it
                with trio.move_on_after(delay):
                    await self._trio.until_stopped()
                    return
        finally:
            self._health.down(None, restarting=False)
            self._abandon_fetches(fetch_recv)

    async def _run_host(self, port: int, publish_recv, fetch_recv, thanks_recv, senders) -> None:
        """One life of the libp2p host; returns when stopped, raises when any of its services fails."""
        s = self.settings
        noise = NoiseTransport(self.key_pair, noise_privkey=create_x25519_key_pair().private_key)
        listen = multiaddr.Multiaddr(f"/ip4/{s.listen_host}/tcp/{port}")
        host = new_host(
            key_pair=self.key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only: never plaintext
            peerstore_opt=DialablePeerstore(loopback_ok=is_loopback(str(listen))),
            # identify advertises these: never the wildcard we listen on (peers would dial themselves)
            addrs_factory=lambda found: [multiaddr.Multiaddr(a) for a in dialable_addrs([str(m) for m in found], "")],
            listen_addrs=[listen],
            transports=[CountingTCP(self.counters)],
            enable_mDNS=s.mdns,
            connection_config=HELPER_CONNECTIONS if s.helper else CONNECTIONS,
        )
        self._host = host
        free_inbound_slots_on_close(host.get_network())
        relay = CountingRelay(host, HELPER_LIMITS if s.helper else NODE_LIMITS, allow_hop=s.helper,
                              stop_from=None if s.helper else lambda helper: helper in relay_client.reserved)
        if self._relay is not None:  # a restarted host: the figures carry on
            relay.relayed_bytes = self._relay.relayed_bytes
        self._relay = relay
        relay_client = None if s.helper else RelayClient(host, relay)
        gossipsub = gossip_router(self._keep.valued, self._peer_rank, self._app_score, self.forwarding)
        pubsub = GuardedPubsub(host, gossipsub, strict_signing=True)
        self._pubsub = pubsub
        authors = AuthorDialer(host, self.cooldown, dial_circuit=relay_client.dial if relay_client else None)
        self._bundles = BundleExchange(host, s.fetch_protocol, s.fetch_timeout_s, self._serve, self._on_fetched,
                                       self.fetch_latency_s, keeps_connection=self._keep.valued,
                                       dial_author=authors.dial, on_served=self._on_served, upload=self.serving)
        if s.mdns:
            from libp2p.discovery.events.peerDiscovery import peerDiscovery

            peerDiscovery.register_peer_discovered_handler(self._dialer.discovered)
        try:
            async with host.run(listen_addrs=[listen]), trio.open_nursery() as nursery:
                host.set_stream_handler(s.fetch_protocol, self._serve_stream)
                self.thanks = Thanks(host, s.thanks_protocol, self._on_thanked)
                host.set_stream_handler(s.thanks_protocol, self.thanks.serve)
                if s.helper:
                    self._dialback = DialBackServer(host, answered=self._dialback.answered if self._dialback else 0)
                    host.set_stream_handler(s.dialback_protocol, self._dialback.serve)
                async with (background_trio_service(pubsub), background_trio_service(gossipsub),
                            background_trio_service(relay)):
                    await pubsub.wait_until_ready()
                    await self.shards.apply(host, pubsub, nursery)  # subscribes, with the validator
                    self.listen_addrs = dialable_addrs([str(a) for a in host.get_addrs()], self.peer_id)
                    self._bound_port = _tcp_port(self.listen_addrs) or port
                    if not self._trio.is_ready:
                        self._publish_send, self._fetch_send, self._thanks_send = senders
                        self._trio.ready()
                    self._health.up()
                    nursery.start_soon(self.shards.run, host, pubsub, nursery)
                    nursery.start_soon(self._publisher.publish_each, pubsub, publish_recv, s.publish_interval_s)
                    nursery.start_soon(self._publisher.republish_to_returning_targets, pubsub)
                    nursery.start_soon(self._bundles.fetch_each, fetch_recv)
                    nursery.start_soon(self.thanks.send_each, thanks_recv, nursery)
                    nursery.start_soon(self._dialer.run, host)
                    nursery.start_soon(self._keeper.run, host, pubsub, s.topic)
                    if relay_client is not None:
                        nursery.start_soon(keep_reachable, host, relay_client, self._reachability,
                                           s.dialback_protocol, self.peer_id, self._bound_port, self._dialled_by_id)
                    else:
                        nursery.start_soon(free_departed_slots, host, relay)
                    await self._trio.until_stopped()
                    nursery.cancel_scope.cancel()
        finally:
            self._dialer.forget_connections()
            if s.mdns:
                from libp2p.discovery.events.peerDiscovery import peerDiscovery

                peerDiscovery.unregister_peer_discovered_handler(self._dialer.discovered)

    def _dialled_by_id(self) -> dict[str, str]:
        """Connected peers we dialled -> the address that worked (a helper's, for circuit addresses)."""
        return {a.rsplit("/p2p/", 1)[-1]: a for a in self._dialer.connected_addrs() if not is_circuit(a)}

    def _abandon_fetches(self, fetch_recv) -> None:
        """Fetches asked for but never started still get an outcome: the node's figures count them."""
        while True:
            try:
                peer, digest, _max_bytes, _addrs = fetch_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            self._on_fetched(peer, digest, None, *with_words(FetchOutcome.ABANDONED), 0.0)

    async def _serve_stream(self, stream) -> None:
        # The bundle protocol's handler, as a method: a test peer overrides it to misbehave.
        await self._bundles.serve(stream)

    def _gossip_validator(self, forwarder: ID, msg) -> bool:
        origin = ID(msg.from_id).to_base58()
        if origin == self.peer_id:
            return True
        try:
            verdict = self._validate(origin, bytes(msg.data))
        except Exception:  # noqa: BLE001 — a validator bug must reject, not crash the router
            log.exception("announcement validator failed")
            return False
        if verdict is Verdict.IGNORE:
            raise IgnoredMessage  # py-libp2p's validators say only yes or no: GuardedPubsub drops it unblamed
        return bool(verdict)


def _tcp_port(addrs: list[str]) -> int:
    for addr in addrs:
        parts = addr.split("/")
        if "tcp" in parts:
            return int(parts[parts.index("tcp") + 1])
    return 0

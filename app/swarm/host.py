"""The node's libp2p host, in its own thread running trio (py-libp2p is trio-only).

The round loop never waits on the network and the network never waits on the round loop: the
node calls the thread-safe, non-blocking methods below (`publish`, `fetch`, `stats`), which hand
work to trio with `run_sync_soon`; what arrives is handed back through callbacks that only touch
thread-safe structures (the announcement board and the inbox).

py-libp2p 0.8.1's sharp edges, and what this module does about each:
- the default host also accepts `/plaintext/2.0.0` (peer-ID impersonation): Noise is the only
  security transport offered or accepted;
- `connect()` deadlocks if Pubsub/GossipSub are built but not started: both run before any dial;
- GossipSub's heartbeat defaults to 120 s: 1 s;
- its spam protection also throttles our own publishes: off, per-origin limits live in the
  topic validator (`gossip_validator`), which runs before anything is relayed;
- `publish()` drops silently when a peer's 32-slot queue is full: publishes are paced;
- messages of 1 MiB or more vanish: gossip carries small announcements, bundles travel on a
  request/response stream with its own size cap;
- peer scoring ships off, and its P4 weight has the opposite sign to go-libp2p's: configured
  here explicitly (positive weights are penalties).
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import ScoreParams, TopicScoreParams
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.transport.tcp.tcp import TCP

from .addresses import dialable_addrs, interface_hosts  # noqa: F401 — interface_hosts: re-exported
from .identity import peer_id_of

log = logging.getLogger("swarmling.swarm")

GOSSIPSUB_PROTOCOL = TProtocol("/meshsub/1.1.0")
DIAL_TIMEOUT_S = 10.0
MAX_SERVING = 8  # bundle uploads in flight at once; more requests wait
MAX_FETCHING = 4
# Connections are bounded whatever the swarm's size; py-libp2p's auto-connector (which dials every
# address in the peerstore, ephemeral ports included, whenever fewer than 100 are open) is off:
# this module decides whom to dial.
CONNECTIONS = ConnectionConfig(max_connections=64, high_watermark=48, low_watermark=0, min_connections=0,
                               max_connections_per_peer=2)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 2.0, 300.0
# Bootstrap and static peers the user named are often just starting up too: retry them at least
# this often, while remembered and discovered peers (maybe gone for good) back off to BACKOFF_MAX_S.
NAMED_BACKOFF_MAX_S = 15.0


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

    @property
    def topic(self) -> str:
        return f"/swarmling/{self.swarm}/{self.version}/announce"

    @property
    def fetch_protocol(self) -> TProtocol:
        return TProtocol(f"/swarmling/{self.swarm}/{self.version}/bundle")


@dataclass
class Counters:
    """Bytes on the wire (after Noise and muxing: what the volunteer's network carries)."""

    bytes_in: int = 0
    bytes_out: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, inbound: int = 0, outbound: int = 0) -> None:
        with self.lock:
            self.bytes_in += inbound
            self.bytes_out += outbound

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return self.bytes_in, self.bytes_out


class _CountingStream:
    """Wraps a TCP stream to count every byte read and written."""

    def __init__(self, inner, counters: Counters) -> None:
        self._inner, self._counters = inner, counters

    async def read(self, n: int | None = None) -> bytes:
        data = await self._inner.read(n)
        self._counters.add(inbound=len(data))
        return data

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)
        self._counters.add(outbound=len(data))

    def __getattr__(self, name):  # close, get_remote_address, …
        return getattr(self._inner, name)


class _CountingTCP(TCP):
    def __init__(self, counters: Counters) -> None:
        super().__init__()
        self._counters = counters

    async def dial(self, maddr):
        conn = await super().dial(maddr)
        if isinstance(conn, RawConnection):
            conn.stream = _CountingStream(conn.stream, self._counters)
        return conn

    def create_listener(self, handler_function):
        counters = self._counters

        async def counted(stream):
            await handler_function(_CountingStream(stream, counters))

        return super().create_listener(counted)


def _score_params(app_score: Callable[[ID], float]) -> ScoreParams:
    return ScoreParams(
        # P4: a peer that forwards messages our validator rejects loses 10 per message (capped);
        # py-libp2p subtracts weight × count, so the weight is positive.
        p4_invalid_messages=TopicScoreParams(weight=10.0, cap=100.0, decay=0.99),
        p5_behavior_penalty_weight=1.0,
        p5_behavior_penalty_decay=0.99,
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


def parse_peer_addr(text: str) -> PeerInfo:
    """A dialable /ip4|ip6|dns…/tcp/<port>/p2p/<peer id> address, or ValueError saying why not."""
    try:
        info = info_from_p2p_addr(multiaddr.Multiaddr(text))
    except Exception as exc:  # noqa: BLE001 — multiaddr raises several unrelated types
        raise ValueError(f"{text!r} is not a peer address like /ip4/192.0.2.1/tcp/38433/p2p/12D3Koo…: {exc}") from None
    return info


GossipValidator = Callable[[str, bytes], bool]  # (origin peer id, data) -> accept
BundleSource = Callable[[str], bytes | None]  # digest -> our bundle, if we still have it
FetchDone = Callable[[str, str, bytes | None, str, float], None]  # peer, digest, body|None, why, seconds


class SwarmHost:
    def __init__(
        self,
        settings: HostSettings,
        key_pair: KeyPair,
        gossip_validator: GossipValidator,
        serve_bundle: BundleSource,
        on_fetched: FetchDone,
        app_score: Callable[[str], float] = lambda peer: 0.0,
    ) -> None:
        self.settings = settings
        self.key_pair = key_pair
        self.peer_id = peer_id_of(key_pair)
        self._validate = gossip_validator
        self._serve = serve_bundle
        self._on_fetched = on_fetched
        self._app_score = app_score
        self.counters = Counters()
        self.listen_addrs: list[str] = []
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stop: trio.Event | None = None
        self._publish_send = None
        self._fetch_send = None
        self._lock = threading.Lock()
        self._connected: set[str] = set()
        self._dial_targets: dict[str, PeerInfo] = {}  # peer id -> addresses we may dial
        self._backoff: dict[str, tuple[float, float]] = {}  # peer id -> (next try, delay)
        self._named: set[str] = set()  # dial targets from the settings
        self._discovered: list[PeerInfo] = []  # from mDNS (another thread) and announcements
        self._dialled: dict[str, str] = {}  # peer id -> an address that worked, worth remembering
        self.fetch_latency_s: deque[float] = deque(maxlen=64)  # recent successful fetches (bounded: hours of rounds)

    # ---- thread-safe API ---------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        for i, text in enumerate(self.settings.dial):
            info = parse_peer_addr(text)
            self._dial_targets[info.peer_id.to_base58()] = info
            if i < self.settings.named:
                self._named.add(info.peer_id.to_base58())
        self._thread = threading.Thread(target=self._thread_main, name="swarmling-libp2p", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise SwarmError(f"the libp2p host did not start within {timeout_s:.0f} s")
        if self._start_error is not None:
            raise SwarmError(f"could not start the swarm host on port {self.settings.port}: {self._start_error}") from None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    def publish(self, data: bytes) -> bool:
        """Queue an announcement; False when the host is not running or the queue is full."""
        return self._to_trio(self._publish_send, data)

    def fetch(self, peer: str, digest: str, max_bytes: int, addrs: tuple[str, ...] = ()) -> bool:
        """Fetch a bundle by digest from the peer that announced it; the result goes to `on_fetched`."""
        return self._to_trio(self._fetch_send, (peer, digest, max_bytes, addrs))

    def add_dial_target(self, text: str) -> None:
        """A peer address learnt at run time (mDNS, an announcement); dialled by the connection loop."""
        try:
            info = parse_peer_addr(text)
        except ValueError:
            return
        with self._lock:
            self._discovered.append(info)

    def connected_peers(self) -> list[str]:
        with self._lock:
            return sorted(self._connected)

    def connected_addrs(self) -> list[str]:
        """Dialable addresses of connected peers that we reached by dialling."""
        with self._lock:
            return [addr for pid, addr in self._dialled.items() if pid in self._connected]

    def _remember(self, info: PeerInfo) -> None:
        if info.addrs:
            pid = info.peer_id.to_base58()
            with self._lock:
                self._dialled[pid] = f"{info.addrs[0]}/p2p/{pid}"
                self._connected.add(pid)

    def _to_trio(self, channel, item) -> bool:
        if self._token is None or channel is None:
            return False
        accepted = []

        def put() -> None:
            try:
                channel.send_nowait(item)
                accepted.append(True)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                log.debug("swarm queue full or closed; dropped one item")

        try:
            self._token.run_sync_soon(put)
        except trio.RunFinishedError:
            return False
        return True

    # ---- the trio side -----------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 — reported to start() or logged; never kills the node
            if not self._started.is_set():
                self._start_error = exc
                self._started.set()
            else:
                log.warning("swarm host stopped: %s", exc)
        finally:
            self._token = None

    async def _main(self) -> None:
        s = self.settings
        noise = NoiseTransport(self.key_pair, noise_privkey=create_x25519_key_pair().private_key)
        listen = multiaddr.Multiaddr(f"/ip4/{s.listen_host}/tcp/{s.port}")
        host = new_host(
            key_pair=self.key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only: never plaintext
            listen_addrs=[listen],
            transports=[_CountingTCP(self.counters)],
            enable_mDNS=s.mdns,
            connection_config=CONNECTIONS,
        )
        self._host = host
        gossipsub = GossipSub(
            protocols=[GOSSIPSUB_PROTOCOL],
            degree=6,
            degree_low=4,
            degree_high=12,
            heartbeat_interval=1,
            heartbeat_initial_delay=0.5,
            spam_protection_enabled=False,
            score_params=_score_params(lambda pid: self._app_score(pid.to_base58())),
        )
        pubsub = Pubsub(host, gossipsub, strict_signing=True)
        self._pubsub = pubsub
        pubsub.set_topic_validator(s.topic, self._gossip_validator, False)
        self._stop = trio.Event()
        publish_send, publish_recv = trio.open_memory_channel(64)
        fetch_send, fetch_recv = trio.open_memory_channel(256)
        self._fetch_limit = trio.Semaphore(MAX_FETCHING)
        self._serve_limit = trio.Semaphore(MAX_SERVING)
        if s.mdns:
            from libp2p.discovery.events.peerDiscovery import peerDiscovery

            peerDiscovery.register_peer_discovered_handler(self._on_mdns)
        try:
            async with host.run(listen_addrs=[listen]), trio.open_nursery() as nursery:
                host.set_stream_handler(s.fetch_protocol, self._serve_stream)
                async with background_trio_service(pubsub), background_trio_service(gossipsub):
                    await pubsub.wait_until_ready()
                    subscription = await pubsub.subscribe(s.topic)
                    self.listen_addrs = dialable_addrs([str(a) for a in host.get_addrs()], self.peer_id)
                    self._token = trio.lowlevel.current_trio_token()
                    self._publish_send, self._fetch_send = publish_send, fetch_send
                    self._started.set()
                    nursery.start_soon(self._drain_subscription, subscription)
                    nursery.start_soon(self._publish_loop, publish_recv)
                    nursery.start_soon(self._fetch_loop, fetch_recv, nursery)
                    nursery.start_soon(self._connection_loop)
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if s.mdns:
                from libp2p.discovery.events.peerDiscovery import peerDiscovery

                peerDiscovery.unregister_peer_discovered_handler(self._on_mdns)

    def _on_mdns(self, info: PeerInfo) -> None:  # zeroconf's thread
        with self._lock:
            self._discovered.append(info)

    def _gossip_validator(self, forwarder: ID, msg) -> bool:
        origin = ID(msg.from_id).to_base58()
        if origin == self.peer_id:
            return True
        try:
            return bool(self._validate(origin, bytes(msg.data)))
        except Exception:  # noqa: BLE001 — a validator bug must reject, not crash the router
            log.exception("announcement validator failed")
            return False

    async def _drain_subscription(self, subscription) -> None:
        # Validation (and everything we need from a message) happened in the validator; the
        # subscription is drained so it does not grow.
        while True:
            await subscription.get()

    async def _publish_loop(self, recv) -> None:
        async for data in recv:
            # publish() drops silently once a peer's queue is full: wait while any is half full.
            deadline = trio.current_time() + 10.0
            while trio.current_time() < deadline and any(
                len(q) >= 16 for q in list(self._pubsub.peer_queues.values())
            ):
                await trio.sleep(0.05)
            try:
                await self._pubsub.publish(self.settings.topic, data)
            except Exception as exc:  # noqa: BLE001 — no peers, closing: the next round publishes again
                log.info("publish failed: %s", exc)
            await trio.sleep(self.settings.publish_interval_s)

    # ---- connections -------------------------------------------------------------------------
    async def _connection_loop(self) -> None:
        """Keep bootstrap, static, remembered and discovered peers connected, with backoff."""
        host = self._host
        while True:
            with self._lock:
                discovered, self._discovered = self._discovered, []
            for info in discovered:
                pid = info.peer_id.to_base58()
                if pid != self.peer_id and len(self._dial_targets) < 256:
                    self._dial_targets.setdefault(pid, info)
            connected = {p.to_base58() for p in host.get_connected_peers()}
            with self._lock:
                self._connected = connected
            now = time.monotonic()
            for pid, info in list(self._dial_targets.items()):
                if pid in connected or pid == self.peer_id:
                    self._backoff.pop(pid, None)
                    continue
                next_try, delay = self._backoff.get(pid, (0.0, BACKOFF_FIRST_S))
                if now < next_try:
                    continue
                ok = False
                with trio.move_on_after(DIAL_TIMEOUT_S):
                    try:
                        await host.connect(info)
                        ok = True
                    except Exception as exc:  # noqa: BLE001 — unreachable peers are normal
                        log.debug("dial %s failed: %s", pid[:16], exc)
                if ok:
                    self._backoff.pop(pid, None)
                    self._remember(info)
                else:
                    jitter = random.uniform(0.8, 1.2)
                    cap = NAMED_BACKOFF_MAX_S if pid in self._named else BACKOFF_MAX_S
                    self._backoff[pid] = (time.monotonic() + delay * jitter, min(cap, delay * 2))
            with self._lock:
                self._connected = {p.to_base58() for p in host.get_connected_peers()}
            await trio.sleep(1.0)

    # ---- bundles over request/response streams -------------------------------------------------
    async def _fetch_loop(self, recv, nursery) -> None:
        async for peer, digest, max_bytes, addrs in recv:
            nursery.start_soon(self._fetch_one, peer, digest, max_bytes, addrs)

    async def _fetch_one(self, peer: str, digest: str, max_bytes: int, addrs: tuple[str, ...]) -> None:
        started = time.perf_counter()
        body, why = None, ""
        transient = False
        async with self._fetch_limit:
            with trio.move_on_after(self.settings.fetch_timeout_s) as scope:
                try:
                    pid = ID.from_base58(peer)
                    if peer not in {p.to_base58() for p in self._host.get_connected_peers()}:
                        infos = [i for i in (self._safe_parse(a) for a in addrs) if i and i.peer_id == pid]
                        if not infos:
                            raise ConnectionError("not connected and no address announced")
                        await self._host.connect(infos[0])
                        # A connection made only for this fetch is closed after it: every open
                        # connection carries gossip control traffic, so keeping them would make a
                        # node's traffic grow with the number of peers it ever fetched from.
                        transient = peer not in self._dial_targets
                    stream = await self._host.new_stream(pid, [self.settings.fetch_protocol])
                    try:
                        await stream.write(digest.encode("ascii") + b"\n")
                        header = await _read_exact(stream, 4)
                        (length,) = struct.unpack(">I", header)
                        if length == 0:
                            why = "the peer no longer has that bundle"
                        elif length > max_bytes:
                            why = f"announced bundle is {length} bytes, over the {max_bytes} limit"
                        else:
                            body = await _read_exact(stream, length)
                    finally:
                        await stream.close()
                except Exception as exc:  # noqa: BLE001 — the peer vanished, reset, spoke nonsense
                    why = f"fetch failed: {type(exc).__name__}: {exc}"[:200]
                    body = None
            if scope.cancelled_caught:
                why, body = f"fetch timed out after {self.settings.fetch_timeout_s:.0f} s", None
            if transient:
                with trio.move_on_after(2.0):
                    try:
                        await self._host.disconnect(ID.from_base58(peer))
                    except Exception as exc:  # noqa: BLE001 — already gone is fine
                        log.debug("closing the fetch connection to %s: %s", peer[:16], exc)
        seconds = time.perf_counter() - started
        if body is not None:
            self.fetch_latency_s.append(seconds)
        self._on_fetched(peer, digest, body, why, seconds)

    @staticmethod
    def _safe_parse(text: str) -> PeerInfo | None:
        try:
            return parse_peer_addr(text)
        except ValueError:
            return None

    async def _serve_stream(self, stream) -> None:
        async with self._serve_limit:
            try:
                with trio.move_on_after(self.settings.fetch_timeout_s):
                    request = await _read_line(stream, 80)
                    body = self._serve(request.decode("ascii", "replace"))
                    if body is None:
                        await stream.write(struct.pack(">I", 0))
                    else:
                        await stream.write(struct.pack(">I", len(body)) + body)
            except Exception as exc:  # noqa: BLE001 — a requester that hangs up is not our problem
                log.debug("serving a bundle failed: %s", exc)
            finally:
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001
                    pass


async def _read_exact(stream, n: int) -> bytes:
    """libp2p streams return partial chunks: read until n bytes or EOF (an error)."""
    parts, got = [], 0
    while got < n:
        chunk = await stream.read(n - got)
        if not chunk:
            raise EOFError(f"stream ended after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


async def _read_line(stream, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        if len(data) >= limit:
            raise ValueError("request line too long")
        chunk = await stream.read(1)
        if not chunk:
            raise EOFError("request ended early")
        data += chunk
    return data[:-1]

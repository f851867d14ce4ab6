"""Bundles over a request/response stream, fetched from the peer that announced them.

Gossip drops messages of 1 MiB or more and copies each to every mesh peer, so bundles never ride
it: a node asks the author directly, on the swarm's bundle protocol. Framing:

    request   <digest, ASCII hex>\\n                       at most REQUEST_LINE_LIMIT bytes
    reply     <length: 4 bytes big-endian><bundle>        length 0: "no longer have it",
                                                          length 0xFFFFFFFF: "busy, ask again later"

Every wait has a deadline sized to what it waits for, so a peer can hold a slot only as long as it
keeps delivering:
- fetching: a connection that exists (either direction) is used; else the author is dialled
  first (`dial_author`: dialer.py's `AuthorDialer`, with its own slots and deadlines, and a
  cooldown for authors it could not reach), so unreachable authors never hold the transfer slots
  (MAX_FETCHING) that reachable ones need. A transfer must start within FIRST_BYTE_S and keep at
  least MIN_RATE_BPS (and end within the fetch timeout); one transfer per author at a time.
- serving: each peer gets each bundle once (`ServedOnce`: an honest fetcher never asks twice, so a
  replayed announcement or a repeated request costs the node a check, not an upload); a request must arrive within REQUEST_TIMEOUT_S, a peer gets at most
  MAX_SERVING_PER_PEER of the MAX_SERVING upload slots, a stream waits at most SERVE_QUEUE_S for
  one, and the reply must leave at MIN_RATE_BPS: streams that never ask, or read slowly, are reset.
  Uploads over a helper's relay are bounded per minute (RELAYED_SERVES) on top of that. A request
  refused for load is answered "busy" rather than reset: the fetcher then knows the peer did
  nothing wrong (a reset counts against it, and tiny rounds ask more often than the quota allows).
Every fetch asked for gets an outcome (`FetchDone`, with a `FetchOutcome`), even one cut short by
the host stopping.
"""

from __future__ import annotations

import enum
import logging
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..nat.relay import is_circuit, relay_of
from ..p2p.streams import read_exact, read_line, remote_peer, reset_quietly
from .forwarding import UploadBudget

log = logging.getLogger("swarmling.swarm")

MAX_SERVING = 8  # bundle uploads in flight at once
MAX_SERVING_PER_PEER = 2  # so a few peers cannot take them all
SERVE_QUEUE_S = 2.0  # longest a request waits for an upload slot before its stream is reset
REQUEST_TIMEOUT_S = 3.0  # a stream that has not asked for anything by then is reset
MAX_FETCHING = 4  # transfers in flight at once
# Uploads through a helper's relay cost the helper's bandwidth too: at most this many per window
# (a round is about a minute on a CPU node), whoever asks. One peer's share is bounded by
# ServedOnce (each of our bundles once), not per window: a window sized for minute-long rounds
# refused most fetches of tiny rounds.
RELAYED_SERVES, RELAYED_WINDOW_S = 16, 60.0
SERVED_DIGESTS = 16  # bundles whose fetchers are remembered (a node keeps 4: network.OWN_BUNDLES_KEPT)
SERVED_PEERS = 4096  # fetchers remembered per bundle; beyond, the bundle is refused (identities are free)
FIRST_BYTE_S = 5.0  # the reply header must arrive (or leave) within this
MIN_RATE_BPS = 64 * 1024  # a 512 KiB bundle at this rate takes 8 s; slower peers are cut off
REQUEST_LINE_LIMIT = 80
BUSY = 0xFFFFFFFF  # the reply's length field when the server refuses for load (never a bundle's length)
CLOSE_TIMEOUT_S = 2.0  # closing a connection made only for one fetch
IDLE_CLOSE_S = 10.0  # a connection made only for fetches is closed after this long without one
IDLE_CHECK_S = 1.0  # how often connections made for fetches are looked at


class FetchOutcome(enum.Enum):
    """How a fetch ended. Only FAILED counts against the author; the others say nothing of it
    (ours, or its helper's doing). A value is the outcome in words, as the round's record gives it
    (`SwarmRoundStats.fetch_failures`); FAILED's words come with each failure (what went wrong)."""

    FETCHED = "fetched"
    FAILED = "failed"
    ABANDONED = "not fetched: the swarm host stopped first"
    IN_FLIGHT = "a fetch from this peer is already in flight"
    COOLING = "could not be dialled lately: not tried again yet"
    NO_ROUTE = "not fetched: no route to this peer (its helper is away, or it announced only its LAN's addresses)"
    SLOW_CIRCUIT = "not fetched: the circuit through the peer's helper did not open in time"
    BUSY = "not fetched: the peer was busy (upload slots, its quota through a helper, or its upload cap)"

    @property
    def blames_peer(self) -> bool:
        return self is FetchOutcome.FAILED


BundleSource = Callable[[str], bytes | None]  # digest -> our bundle, if we still have it
# peer, digest, body (None unless FETCHED), how it ended, that in words ("" when fetched), seconds
FetchDone = Callable[[str, str, bytes | None, FetchOutcome, str, float], None]
Outcome = tuple[FetchOutcome, str]  # how a fetch ended, and that in words
DialAuthor = Callable[[str, ID, tuple[str, ...]], Awaitable[Outcome | None]]  # None: connected


class BundleExchange:
    """Both ends of the bundle protocol on one libp2p host (trio side only)."""

    def __init__(
        self,
        host,
        protocol: TProtocol,
        timeout_s: float,
        source: BundleSource,
        on_fetched: FetchDone,
        latencies_s: deque[float],
        keeps_connection: Callable[[str], bool],
        dial_author: DialAuthor,
        on_served: Callable[[str], None] = lambda peer: None,
        upload: UploadBudget | None = None,
    ) -> None:
        self._host = host
        self._protocol = protocol
        self._timeout_s = timeout_s
        self._source = source
        self._on_fetched = on_fetched
        self._latencies_s = latencies_s  # successful fetches' durations are appended here
        self._keeps_connection = keeps_connection  # peer id -> is it a dial target
        self._dial_author = dial_author  # connects to an author we have no connection with (dialer.py)
        self._on_served = on_served  # peer id, once one of our bundles was written to it whole (given.py)
        self._upload = upload  # the user's upload cap for serving (forwarding.py); None: slots alone
        self.relayed_serves = RelayedServes()
        self.served = ServedOnce()
        self._fetch_limit = trio.Semaphore(MAX_FETCHING)
        self._serve_limit = trio.Semaphore(MAX_SERVING)
        self._fetching: set[str] = set()  # authors with a fetch in flight
        self._transient: dict[str, float] = {}  # peers connected only for fetches -> last bundle activity
        self._serving: dict[str, int] = {}  # peer -> uploads in flight or waiting

    async def fetch_each(self, requests: trio.MemoryReceiveChannel) -> None:
        """Fetch every (peer, digest, max_bytes, addrs) that arrives, concurrently."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.close_idle)
            async for peer, digest, max_bytes, addrs in requests:
                nursery.start_soon(self.fetch, peer, digest, max_bytes, addrs)

    async def fetch(self, peer: str, digest: str, max_bytes: int, addrs: tuple[str, ...]) -> None:
        """Fetch one bundle; the outcome, success or why not, always goes to `on_fetched`."""
        started = time.perf_counter()
        body, (outcome, why) = None, with_words(FetchOutcome.ABANDONED)  # what stays if the host stops under us
        try:
            body, (outcome, why) = await self._fetch_once(peer, digest, max_bytes, addrs)
        finally:
            seconds = time.perf_counter() - started
            if body is not None:
                self._latencies_s.append(seconds)
            self._on_fetched(peer, digest, body, outcome, why, seconds)

    async def _fetch_once(self, peer: str, digest: str, max_bytes: int, addrs) -> tuple[bytes | None, Outcome]:
        if peer in self._fetching:
            return None, with_words(FetchOutcome.IN_FLIGHT)
        self._fetching.add(peer)
        transient = False
        try:
            pid = ID.from_base58(peer)
            if peer not in {p.to_base58() for p in self._host.get_connected_peers()}:
                failed = await self._dial_author(peer, pid, addrs)
                if failed is not None:
                    return None, failed
                # A connection made only for fetches is closed once idle (close_idle): every open
                # connection carries gossip control traffic, so keeping them would make a
                # node's traffic grow with the number of peers it ever fetched from. Marked now,
                # not when the fetch ends: a fetch that hangs must not hide its connection.
                transient = not self._keeps_connection(peer)
                if transient:
                    self._transient[peer] = time.monotonic()
            async with self._fetch_limit:
                with trio.move_on_after(self._timeout_s) as scope:
                    # A peer that falls silent never answers the stream's negotiation: without a
                    # deadline of its own that waited the whole fetch timeout, holding a fetch slot.
                    with trio.move_on_after(FIRST_BYTE_S) as opening:
                        stream = await self._host.new_stream(pid, [self._protocol])
                    if opening.cancelled_caught:
                        return None, (FetchOutcome.FAILED, f"no answer within {FIRST_BYTE_S:.0f} s")
                    try:
                        return await _request(stream, digest, max_bytes)
                    finally:
                        await reset_quietly(stream)
            assert scope.cancelled_caught
            return None, (FetchOutcome.FAILED, f"fetch timed out after {self._timeout_s:.0f} s")
        except Exception as exc:  # noqa: BLE001 — the peer vanished, reset, spoke nonsense
            if self._helper_left(peer, addrs):  # the circuit went with its helper: not the author's doing
                return None, with_words(FetchOutcome.NO_ROUTE)
            return None, (FetchOutcome.FAILED, f"fetch failed: {type(exc).__name__}: {exc}"[:200])
        finally:
            self._fetching.discard(peer)
            if transient:
                self._transient[peer] = time.monotonic()  # closed once idle: close_idle()

    def _helper_left(self, peer: str, addrs: tuple[str, ...]) -> bool:
        """The author is reached through helpers (it announced relay slots) and none of them is
        connected now, or the circuit itself is gone: a fetch cut short then died with its circuit
        (a helper stopping or restarting; its connection can outlive it by a moment)."""
        helpers = {relay_of(a) for a in addrs if is_circuit(a)} - {""}
        if not helpers:
            return False
        try:
            connected = {p.to_base58() for p in self._host.get_connected_peers()}
        except Exception:  # noqa: BLE001 — the host is going down: nobody's fault either
            return True
        return not helpers & connected or peer not in connected

    async def close_idle(self) -> None:
        """Close connections made only for fetches once no bundle has crossed them for IDLE_CLOSE_S.

        Not at once: two nodes fetch from each other in the same round, and the second may be
        using (or about to use) the connection the first made; closing it cut that fetch short."""
        while True:
            await trio.sleep(IDLE_CHECK_S)
            now = time.monotonic()
            idle = []
            for peer, last in list(self._transient.items()):
                if peer in self._fetching or self._serving.get(peer, 0):
                    self._transient[peer] = now
                elif now - last > IDLE_CLOSE_S:
                    del self._transient[peer]
                    if not self._keeps_connection(peer):
                        idle.append(peer)
            # All at once: one after the other, each up to CLOSE_TIMEOUT_S, thirty silent peers
            # held their connections a minute longer.
            async with trio.open_nursery() as nursery:
                for peer in idle:
                    nursery.start_soon(self._close, peer)

    async def _close(self, peer: str) -> None:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            try:
                await self._host.disconnect(ID.from_base58(peer))
            except Exception as exc:  # noqa: BLE001 — already gone is fine
                log.debug("closing the fetch connection to %s: %s", peer[:16], exc)
        if scope.cancelled_caught:  # a polite close that could not finish: looked at again next time
            self._transient.setdefault(peer, time.monotonic() - IDLE_CLOSE_S)

    def fetching_over(self, peer: str) -> bool:
        """Our connection to `peer` was made for fetches and is not closed yet (any thread)."""
        return peer in self._transient

    async def serve(self, stream) -> None:
        """The protocol's stream handler: answer one request within its deadlines, then close."""
        peer = remote_peer(stream)
        if peer in self._transient:
            self._transient[peer] = time.monotonic()
        if self._serving.get(peer, 0) >= MAX_SERVING_PER_PEER or (_is_relayed(stream) and not self.relayed_serves.take(peer)):
            await _say_busy(stream)
            return
        self._serving[peer] = self._serving.get(peer, 0) + 1
        try:
            if await self._answer(stream):
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    await stream.close()
                return
        except Exception as exc:  # noqa: BLE001 — a requester that hangs up is not our problem
            log.debug("serving a bundle to %s failed: %s", peer[:16], exc)
        finally:
            self._serving[peer] -= 1
            if not self._serving[peer]:
                del self._serving[peer]
        await reset_quietly(stream)

    async def _answer(self, stream) -> bool:
        """Read the request and write the reply; False when a deadline or a slot ran out."""
        with trio.move_on_after(SERVE_QUEUE_S):
            async with self._serve_limit:
                with trio.move_on_after(REQUEST_TIMEOUT_S):
                    wanted = (await read_line(stream, REQUEST_LINE_LIMIT)).decode("ascii", "replace")
                    body, peer = self._source(wanted), remote_peer(stream)
                    if body is not None and not self.served.first(peer, wanted):
                        body = None  # this peer had it already: "no longer have it" (for you)
                    if body is not None and self._upload is not None and not self._upload.take(len(body)):
                        self.served.forget(peer, wanted)  # not served: it may ask again
                        await stream.write(struct.pack(">I", BUSY))
                        return True
                    reply = struct.pack(">I", 0) if body is None else struct.pack(">I", len(body)) + body
                    with trio.move_on_after(FIRST_BYTE_S + len(reply) / MIN_RATE_BPS) as writing:
                        await stream.write(reply)
                    if body is not None and not writing.cancelled_caught:
                        self._on_served(remote_peer(stream))
                    return not writing.cancelled_caught
        return False


async def _request(stream, digest: str, max_bytes: int) -> tuple[bytes | None, Outcome]:
    """Ask for one bundle on an open stream: (body, FETCHED) or (None, why not)."""
    await stream.write(digest.encode("ascii") + b"\n")
    with trio.move_on_after(FIRST_BYTE_S) as waiting:
        header = await read_exact(stream, 4)
    if waiting.cancelled_caught:
        return None, (FetchOutcome.FAILED, f"no reply within {FIRST_BYTE_S:.0f} s")
    (length,) = struct.unpack(">I", header)
    if length == 0:
        return None, (FetchOutcome.FAILED, "the peer no longer has that bundle")
    if length == BUSY:
        return None, with_words(FetchOutcome.BUSY)
    if length > max_bytes:
        return None, (FetchOutcome.FAILED, f"announced bundle is {length} bytes, over the {max_bytes} limit")
    with trio.move_on_after(FIRST_BYTE_S + length / MIN_RATE_BPS):
        return await read_exact(stream, length), (FetchOutcome.FETCHED, "")
    return None, (FetchOutcome.FAILED, f"sent slower than {MIN_RATE_BPS // 1024} KiB/s")


async def _say_busy(stream) -> None:
    """Refuse a request for load: "busy" (the request itself need not be read), then hang up."""
    with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
        try:
            await stream.write(struct.pack(">I", BUSY))
            await stream.close()
        except Exception:  # noqa: BLE001 — gone already
            scope.cancel()
    if scope.cancelled_caught:
        await reset_quietly(stream)


def with_words(outcome: FetchOutcome) -> Outcome:
    """An outcome that needs no words beyond its own."""
    return outcome, outcome.value


class ServedOnce:
    """Which peers each recent bundle was served to: a peer gets a bundle once (trio side only)."""

    def __init__(self, digests: int = SERVED_DIGESTS, peers: int = SERVED_PEERS) -> None:
        self._digests, self._peers = digests, peers
        self._served: OrderedDict[str, set[str]] = OrderedDict()
        self.refused = 0

    def first(self, peer: str, digest: str) -> bool:
        """True (and remembered) the first time `peer` asks for `digest`; False after that."""
        peers = self._served.pop(digest, set())
        self._served[digest] = peers
        while len(self._served) > self._digests:
            self._served.popitem(last=False)
        if peer in peers or len(peers) >= self._peers:
            self.refused += 1
            return False
        peers.add(peer)
        return True

    def forget(self, peer: str, digest: str) -> None:
        """`peer` did not get `digest` after all (refused for load): it may ask again."""
        self._served.get(digest, set()).discard(peer)


class RelayedServes:
    """A sliding window of uploads over relayed connections, in all and (optionally) per peer
    (trio side only)."""

    def __init__(self, limit: int = RELAYED_SERVES, per_peer: int | None = None,
                 window_s: float = RELAYED_WINDOW_S, clock=time.monotonic) -> None:
        self._limit, self._per_peer, self._window_s, self._clock = limit, per_peer, window_s, clock
        self._times: deque[tuple[float, str]] = deque()
        self.refused = 0

    def take(self, peer: str = "") -> bool:
        now = self._clock()
        while self._times and now - self._times[0][0] > self._window_s:
            self._times.popleft()
        if len(self._times) >= self._limit or (
                self._per_peer is not None and sum(p == peer for _, p in self._times) >= self._per_peer):
            self.refused += 1
            return False
        self._times.append((now, peer))
        return True


def _is_relayed(stream) -> bool:
    try:
        return any(is_circuit(str(a)) for a in stream.muxed_conn.get_transport_addresses())
    except Exception:  # noqa: BLE001 — unknown: treat as direct
        return False

"""Bundles over a request/response stream, fetched from the peer that announced them.

Gossip drops messages of 1 MiB or more and copies each to every mesh peer, so bundles never ride
it: a node asks the author directly, on the swarm's bundle protocol. Framing:

    request   <digest, ASCII hex>\\n                       at most REQUEST_LINE_LIMIT bytes
    reply     <length: 4 bytes big-endian><bundle>        length 0: "no longer have it"

Both sides give up after the fetch timeout; uploads and downloads in flight are bounded
(MAX_SERVING, MAX_FETCHING), and more wait their turn.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from collections.abc import Callable

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from .dialer import parse_peer_addr

log = logging.getLogger("swarmling.swarm")

MAX_SERVING = 8  # bundle uploads in flight at once; more requests wait
MAX_FETCHING = 4
REQUEST_LINE_LIMIT = 80
CLOSE_TIMEOUT_S = 2.0  # closing a connection made only for one fetch

BundleSource = Callable[[str], bytes | None]  # digest -> our bundle, if we still have it
FetchDone = Callable[[str, str, bytes | None, str, float], None]  # peer, digest, body|None, why, seconds


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
    ) -> None:
        self._host = host
        self._protocol = protocol
        self._timeout_s = timeout_s
        self._source = source
        self._on_fetched = on_fetched
        self._latencies_s = latencies_s  # successful fetches' durations are appended here
        self._keeps_connection = keeps_connection  # peer id -> is it a dial target
        self._fetch_limit = trio.Semaphore(MAX_FETCHING)
        self._serve_limit = trio.Semaphore(MAX_SERVING)

    async def fetch_each(self, requests: trio.MemoryReceiveChannel) -> None:
        """Fetch every (peer, digest, max_bytes, addrs) that arrives, concurrently."""
        async with trio.open_nursery() as nursery:
            async for peer, digest, max_bytes, addrs in requests:
                nursery.start_soon(self.fetch, peer, digest, max_bytes, addrs)

    async def fetch(self, peer: str, digest: str, max_bytes: int, addrs: tuple[str, ...]) -> None:
        """Fetch one bundle; the outcome, success or why not, always goes to `on_fetched`."""
        started = time.perf_counter()
        body, why = None, ""
        transient = False
        async with self._fetch_limit:
            with trio.move_on_after(self._timeout_s) as scope:
                try:
                    pid = ID.from_base58(peer)
                    if peer not in {p.to_base58() for p in self._host.get_connected_peers()}:
                        infos = [i for i in (_peer_info_or_none(a) for a in addrs) if i and i.peer_id == pid]
                        if not infos:
                            raise ConnectionError("not connected and no address announced")
                        await self._host.connect(infos[0])
                        # A connection made only for this fetch is closed after it: every open
                        # connection carries gossip control traffic, so keeping them would make a
                        # node's traffic grow with the number of peers it ever fetched from.
                        transient = not self._keeps_connection(peer)
                    stream = await self._host.new_stream(pid, [self._protocol])
                    try:
                        body, why = await _request(stream, digest, max_bytes)
                    finally:
                        await stream.close()
                except Exception as exc:  # noqa: BLE001 — the peer vanished, reset, spoke nonsense
                    why = f"fetch failed: {type(exc).__name__}: {exc}"[:200]
                    body = None
            if scope.cancelled_caught:
                why, body = f"fetch timed out after {self._timeout_s:.0f} s", None
            if transient:
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    try:
                        await self._host.disconnect(ID.from_base58(peer))
                    except Exception as exc:  # noqa: BLE001 — already gone is fine
                        log.debug("closing the fetch connection to %s: %s", peer[:16], exc)
        seconds = time.perf_counter() - started
        if body is not None:
            self._latencies_s.append(seconds)
        self._on_fetched(peer, digest, body, why, seconds)

    async def serve(self, stream) -> None:
        """The protocol's stream handler: answer one request, then close."""
        async with self._serve_limit:
            try:
                with trio.move_on_after(self._timeout_s):
                    request = await _read_line(stream, REQUEST_LINE_LIMIT)
                    body = self._source(request.decode("ascii", "replace"))
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


async def _request(stream, digest: str, max_bytes: int) -> tuple[bytes | None, str]:
    """Ask for one bundle on an open stream: (body, "") or (None, why not)."""
    await stream.write(digest.encode("ascii") + b"\n")
    header = await _read_exact(stream, 4)
    (length,) = struct.unpack(">I", header)
    if length == 0:
        return None, "the peer no longer has that bundle"
    if length > max_bytes:
        return None, f"announced bundle is {length} bytes, over the {max_bytes} limit"
    return await _read_exact(stream, length), ""


def _peer_info_or_none(text: str) -> PeerInfo | None:
    try:
        return parse_peer_addr(text)
    except ValueError:
        return None


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

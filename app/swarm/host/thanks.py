"""A node tells the authors whose groups its update trained on: "thanks, N of yours", on a protocol
of its own, so a volunteer can see that their rollouts taught someone (issue 40).

One line on a stream of its own (`/swarmling/<swarm>/<version>/thanks`): the count as ASCII
digits. Sent only to an author still connected (never dialled for it), at most one stream in
flight per author. A node of an earlier release has no handler for the protocol: the stream is
refused at negotiation, which costs nothing and blames no one (no gossip topic carries it, so no
announcement decoder ever sees it).

What peers say is shown as what they said and used for nothing else: a liar can only inflate a
figure on its target's screen, and by at most MAX_GROUPS a message and one message per
MIN_GAP_S per peer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..p2p.streams import read_line, remote_peer, reset_quietly

log = logging.getLogger("swarmling.swarm")

MAX_GROUPS = 16  # a round trains on at most this many of one peer's groups (round.questions ≤ 16 a side)
MIN_GAP_S = 5.0  # one message per peer in this long is heard; the rest are dropped
LINE_LIMIT = 8
SEND_TIMEOUT_S = 5.0


def thanks_protocol(swarm: str, version: int) -> TProtocol:
    return TProtocol(f"/swarmling/{swarm}/{version}/thanks")


class Thanks:
    """Both sides of the protocol, on the host's network thread."""

    def __init__(self, host, protocol: TProtocol, on_thanked: Callable[[str, int], None]) -> None:
        self._host, self._protocol, self._on_thanked = host, protocol, on_thanked
        self._last_heard: dict[str, float] = {}
        self._sending: set[str] = set()
        self.heard = self.dropped = 0  # messages received: counted, or not (over the rate, malformed)
        self.attempted = self.refused = 0  # messages we sent: tried, and refused or failed

    @property
    def in_flight(self) -> int:
        return len(self._sending)

    async def serve(self, stream) -> None:
        """The handler: one count from a peer, or nothing."""
        peer = remote_peer(stream)
        try:
            with trio.move_on_after(SEND_TIMEOUT_S):
                line = (await read_line(stream, LINE_LIMIT)).decode("ascii", "replace").strip()
                now = time.monotonic()
                count = int(line) if line.isdigit() else 0
                if 1 <= count <= MAX_GROUPS and now - self._last_heard.get(peer, -MIN_GAP_S) >= MIN_GAP_S:
                    self._last_heard[peer] = now
                    if len(self._last_heard) > 4096:  # identities are free: forget the oldest
                        self._last_heard.pop(next(iter(self._last_heard)))
                    self.heard += 1
                    self._on_thanked(peer, count)
                else:
                    self.dropped += 1
        except Exception as exc:  # noqa: BLE001 — a peer that hangs up or speaks nonsense: nothing to count
            log.debug("thanks from %s: %s", peer[:16], exc)
        await reset_quietly(stream)

    async def send_each(self, recv, nursery) -> None:
        """Send each queued (peer, count) on a task of its own: a slow peer holds up no other."""
        async for peer, count in recv:
            nursery.start_soon(self.send, peer, count)

    async def send(self, peer: str, count: int) -> None:
        """Tell `peer` we trained on `count` of its groups, if it is still connected."""
        if peer in self._sending or not 1 <= count:
            return
        self._sending.add(peer)
        self.attempted += 1
        try:
            pid = ID.from_base58(peer)
            if pid not in self._host.get_connected_peers():
                return  # never dialled for a courtesy (a disconnect racing this may still redial once)
            with trio.move_on_after(SEND_TIMEOUT_S):
                stream = await self._host.new_stream(pid, [self._protocol])
                try:
                    await stream.write(f"{min(count, MAX_GROUPS)}\n".encode("ascii"))
                    await stream.close()
                    try:
                        await stream.read(1)  # until the peer, having read the line, hangs up
                    except Exception:  # noqa: BLE001 — it hangs up with a reset: the line got there
                        pass
                finally:
                    await reset_quietly(stream)
        except Exception as exc:  # noqa: BLE001 — an earlier release refuses the protocol: fine
            self.refused += 1
            log.debug("thanks to %s: %s", peer[:16], exc)
        finally:
            self._sending.discard(peer)

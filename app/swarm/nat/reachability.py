"""Can peers dial this node? Ask a helper to dial back; when it cannot, hold a relay slot.

py-libp2p 0.8.1's AutoNAT (v1) cannot answer this: its server dials back over the connection it
already has, so every node looks reachable (measured in the lab). Instead, a helper serves a tiny
dial-back protocol: a node sends the TCP port it listens on, and the helper opens a *fresh*
connection to the address the request came from (that IP, that port; never another IP, so a
helper cannot be made to dial third parties; and only a routable one: a node on the helper's own
LAN, or behind carrier NAT, is not public) and answers whether it got through. Helpers are the
peers that serve this protocol and the relay's hop; the node believes only an answer about its own
port, and a helper that cannot answer yet ("busy": it dialled us back moments ago) gives no verdict.

The node's verdict (`Reachability`), kept up to date by `keep_reachable` on the host's trio thread:
- "direct": a helper reached us at our public address, which we announce first;
- "relayed": helpers could not, so we hold a slot on up to MAX_HELPERS of them and announce
  `<helper>/p2p-circuit/p2p/<us>` (relay.py): peers fetch our bundles through the helper;
- "unreachable": no helper gave us a slot: peers cannot fetch our rollouts (we still fetch theirs);
- "unknown": no helper connected to ask (a LAN or loopback swarm: peers there dial us directly).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from ..p2p.addresses import routable  # noqa: F401 — its callers import it from here too
from ..p2p.streams import read_line, remote_ip
from .relay import MAX_HELPERS, RelayClient, circuit_addr, is_helper

log = logging.getLogger("swarmling.swarm")

DIALBACK_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 3.0
DIALBACK_PER_PEER_EVERY_S = 20.0  # a helper dials a peer back at most this often
DIALBACKS_AT_ONCE = 4
RECHECK_EVERY_S = 600.0  # a verdict is re-checked this often (a router's port forward may change)
TICK_S = 2.0  # how often the verdict is looked at (cheap: no traffic unless something is due)

State = Literal["unknown", "direct", "relayed", "unreachable"]


def dialback_protocol(swarm: str, version: int) -> TProtocol:
    return TProtocol(f"/swarmling/{swarm}/{version}/dialback")


@dataclass(frozen=True)
class Reachability:
    state: State = "unknown"
    public_addr: str = ""  # direct: where a helper reached us (with /p2p/<us>)
    relay_addrs: tuple[str, ...] = ()  # relayed: our addresses through each helper
    helpers: tuple[str, ...] = ()  # the helpers asked (direct) or holding our slot (relayed)
    checked_at: float | None = None  # wall clock of the last verdict

    def describe(self) -> str:
        if self.state == "direct":
            return f"reachable directly at {self.public_addr.split('/p2p/')[0]}"
        if self.state == "relayed":
            return "through relay " + ", ".join(h[-8:] for h in self.helpers)
        if self.state == "unreachable":
            return "not reachable: peers cannot fetch your rollouts"
        return "not checked: no helper connected (peers on this network can still dial you)"


@dataclass
class ReachabilityBoard:
    """The verdict, written on the trio thread and read from any other."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _now: Reachability = field(default_factory=Reachability)

    def get(self) -> Reachability:
        with self._lock:
            return self._now

    def set(self, value: Reachability) -> None:
        with self._lock:
            if value.state != self._now.state:
                log.info("reachability: %s", value.describe())
            self._now = value


class DialBackServer:
    """A helper's side: dial a node back at its request's IP and the port it names."""

    def __init__(self, host, answered: int = 0) -> None:
        self._host = host
        self._last: dict[str, float] = {}
        self._limit = trio.Semaphore(DIALBACKS_AT_ONCE)
        self.answered = answered  # carried over a host restart

    async def serve(self, stream) -> None:
        try:
            await self._serve(stream)
        except Exception as exc:  # noqa: BLE001 — a requester that hangs up is not our problem
            log.debug("dial-back request failed: %s", exc)
        finally:
            with trio.move_on_after(2.0):
                try:
                    await stream.close()
                except Exception:  # noqa: BLE001
                    pass

    async def _serve(self, stream) -> None:
        peer = stream.muxed_conn.peer_id
        ip = remote_ip(stream)
        now = time.monotonic()
        if ip is None or now - self._last.get(str(peer), -1e9) < DIALBACK_PER_PEER_EVERY_S:
            await stream.write(b"busy\n")
            return
        self._last[str(peer)] = now
        if len(self._last) > 4096:  # forget the oldest: bounded whoever asks
            for key in sorted(self._last, key=self._last.get)[:1024]:
                del self._last[key]
        with trio.fail_after(REQUEST_TIMEOUT_S):
            line = await read_line(stream, 8)
        port = int(line)
        if not 0 < port < 65536:
            raise ValueError(f"bad port {port}")
        addr = f"/ip4/{ip}/tcp/{port}"
        reached = False
        if not routable(ip):  # a node on the helper's own LAN (or behind carrier NAT) is not public
            await stream.write(f"no {addr}\n".encode())
            return
        async with self._limit:
            with trio.move_on_after(DIALBACK_TIMEOUT_S):
                try:
                    conn = await self._host.get_network().dial_addr(multiaddr.Multiaddr(addr), peer)
                    reached = True
                    await conn.close()
                except Exception as exc:  # noqa: BLE001 — not reachable is an answer
                    log.debug("dial-back to %s failed: %s", addr, exc)
        self.answered += 1
        await stream.write(f"{'ok' if reached else 'no'} {addr}\n".encode())


async def ask_dialback(host, protocol: TProtocol, helper: str, port: int) -> tuple[str, str]:
    """Ask one helper to dial us back: ("ok", our public address), ("no", ""), or ("busy", "")
    when it could not say (rate-limited, gone, or an answer that is not about us)."""
    with trio.move_on_after(DIALBACK_TIMEOUT_S + REQUEST_TIMEOUT_S + 2.0):
        try:
            stream = await host.new_stream(ID.from_base58(helper), [protocol])
            try:
                await stream.write(f"{port}\n".encode())
                answer = (await read_line(stream, 128)).decode("ascii", "replace").split()
            finally:
                with trio.move_on_after(2.0):
                    await stream.close()
        except Exception as exc:  # noqa: BLE001 — gone, or not a helper after all
            log.debug("dial-back via %s failed: %s", helper[:16], exc)
            return "busy", ""
        if len(answer) == 2 and answer[0] in ("ok", "no"):
            parts = answer[1].split("/")
            # only an answer about our own listen port on an IPv4 address is believed
            if len(parts) == 5 and parts[1] == "ip4" and parts[3] == "tcp" and parts[4] == str(port):
                return answer[0], answer[1] if answer[0] == "ok" else ""
    return "busy", ""


async def keep_reachable(host, client: RelayClient, board: ReachabilityBoard, protocol: TProtocol,
                         own_peer_id: str, port: int, helper_addrs) -> None:
    """Decide and keep the verdict: dial-back first, relay slots when that fails (runs forever).

    Looks every TICK_S (a helper that went away is noticed within that); a slot is renewed every
    RESERVE_EVERY_S, and taken again as soon as a helper is back. `helper_addrs()` maps connected
    peers we dialled to the address we reached them at: the part of a circuit address peers dial."""
    public, checked_at, asked = "", 0.0, ()
    while True:
        connected = [p.to_base58() for p in host.get_connected_peers()]
        helpers = sorted(p for p in connected if is_helper(host, p, str(protocol)))
        for gone in set(client.reserved) - set(helpers):
            client.forget(gone)
        now = time.monotonic()
        if helpers and (not asked or now - checked_at > RECHECK_EVERY_S or not set(asked) & set(helpers)):
            asked, checked_at, public = tuple(helpers[:MAX_HELPERS]), now, ""
            answers = [await ask_dialback(host, protocol, helper, port) for helper in asked]
            public = next((addr for verdict, addr in answers if verdict == "ok"), "")
            if not public and any(verdict == "busy" for verdict, _ in answers):
                # no verdict yet (a helper that just dialled us back, as `doctor` makes it do):
                # ask again once its rate limit has passed
                checked_at = now - RECHECK_EVERY_S + DIALBACK_PER_PEER_EVERY_S + 1.0
        if not helpers:
            asked = ()
            board.set(Reachability(checked_at=board.get().checked_at))
        elif public:
            board.set(Reachability("direct", public_addr=f"{public}/p2p/{own_peer_id}", helpers=asked,
                                   checked_at=time.time()))
        else:
            known = helper_addrs()
            for helper in [h for h in helpers if h in known][:MAX_HELPERS]:
                if client.due(helper):
                    await client.reserve(helper)  # renews ours; a restarted helper gets it back
            held = tuple(h for h in client.reserved if h in known)
            if held:
                board.set(Reachability("relayed", relay_addrs=tuple(circuit_addr(known[h], own_peer_id) for h in held),
                                       helpers=held, checked_at=time.time()))
            else:
                board.set(Reachability("unreachable", helpers=asked, checked_at=time.time()))
        await trio.sleep(TICK_S)


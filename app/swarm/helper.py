"""`swarmling relay`: a public helper without a model, so volunteers behind home routers meet.

A community starts a swarm with one helper on any machine peers can dial (a small VPS, a Pi with
a forwarded port). It is:
- the bootstrap peer every volunteer dials first (`swarmling invite` prints its address);
- a GossipSub router that validates announcements as every node does (board.py) before it
  relays them, so it never spreads junk, and whose relaying is how nodes hear each other: knowing
  one helper is enough to hear the whole swarm, and each announcement carries its author's
  reachable addresses (peer exchange rides on the announcements);
- a circuit-relay-v2 hop with bounded slots and circuits (relay.py) for nodes that cannot be
  dialled, and a dial-back service that tells each node whether it can (reachability.py).
It keeps no bundles: relaying a fetch costs the helper the bundle twice (in and out) but no
memory, and a bundle is kilobytes (its figures: docs/measured.md; how it works: docs/design.md).

Every FIGURES_EVERY_S it prints one line of figures (peers, slots, circuits, bytes relayed, wire
bytes, RSS, CPU) and writes them to `relay.json` in its data folder for monitoring.

The other side of a helper's dial-back is here too: `probe`, `swarmling doctor`'s reachability
check when no node is running: start the swarm host on the configured port for a few seconds, let
a helper dial it back (reachability.py), report, stop. The port matters (a router forwards one
port), so the check uses the node's own; a running node holds it and answers instead (its verdict
is in `swarmling status`).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ...backends.atomic import write_atomic

from .host.host import HostSettings, SwarmHost
from .nat.reachability import Reachability
from .p2p.addresses import host_addr
from .p2p.identity import Identity, load_or_create
from .verification.board import Board
from .verification.wire import PROTOCOL_VERSION

FIGURES_EVERY_S = 60.0
PROBE_TIMEOUT_S = 30.0  # connect to a helper (≤ 5 s), its dial-back (≤ 5 s), a slot (≤ 10 s)


@dataclass(frozen=True)
class HelperSettings:
    swarm: str
    listen_host: str
    port: int
    dial: tuple[str, ...] = ()  # other helpers: a swarm may have several
    public_host: str = ""  # the address peers dial, when it is not one of this machine's interfaces


class Helper:
    """The helper's host and its figures; `run_until_stopped` is the command's loop."""

    def __init__(self, settings: HelperSettings, identity: Identity, data_dir: Path) -> None:
        self.settings = settings
        self.identity = identity
        self.figures_file = data_dir / "relay.json"
        self.board = Board(settings.swarm, identity.peer_id)
        self.host = SwarmHost(
            HostSettings(settings.swarm, PROTOCOL_VERSION, settings.listen_host, settings.port, settings.dial,
                         named=len(settings.dial), helper=True),
            identity.key_pair,
            gossip_validator=self.board.offer,
            serve_bundle=lambda digest: None,  # keeps none: see the module's docstring
            on_fetched=lambda *outcome: None,
        )
        self._process = psutil.Process()
        self._cpu_mark = (time.monotonic(), self._cpu_seconds())

    def start(self) -> None:
        self.host.start()

    def stop(self) -> None:
        self.host.stop()

    def addresses(self) -> list[str]:
        """Where peers dial this helper: the public host if given, else its interface addresses."""
        if self.settings.public_host:
            port = self.host.listen_addrs[0].split("/tcp/")[1].split("/")[0] if self.host.listen_addrs else self.settings.port
            return [host_addr(self.settings.public_host, int(port), self.identity.peer_id)]
        return list(self.host.listen_addrs)

    def figures(self) -> dict:
        """What the helper carries now; cpu_percent is since the previous call (of one core)."""
        now, cpu = time.monotonic(), self._cpu_seconds()
        then, cpu_then = self._cpu_mark
        self._cpu_mark = (now, cpu)
        bytes_in, bytes_out = self.host.counters.snapshot()
        return {
            "peers": len(self.host.connected_peers()),
            "peers_heard": self.board.peers_heard(),
            "announcements": self.board.received,
            "announcements_refused": dict(self.board.refused),
            **self.host.relay_figures(),
            **asdict(self.host.gossip_figures()),
            "connections_held": self.host.connection_figures(),
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "rss_mb": round(self._process.memory_info().rss / 2**20, 1),
            "cpu_percent": round(100.0 * (cpu - cpu_then) / max(now - then, 1e-6), 1),
            "restarts": self.host.health().restarts,
        }

    def write_figures(self, figures: dict) -> None:
        try:
            write_atomic(self.figures_file, json.dumps({"at": time.time(), **figures}), fsync=False)
        except OSError:
            pass  # figures are a convenience: a full disk must not stop the helper

    def run_until_stopped(self, every_s: float = FIGURES_EVERY_S, say=print) -> None:
        stopping = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopping.set())
        while not stopping.wait(every_s):
            figures = self.figures()
            self.write_figures(figures)
            say(describe(figures))
        self.write_figures(self.figures())  # the last word: what it carried until it was stopped

    def _cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system


def describe(f: dict) -> str:
    return (f"peers {f['peers']} (heard {f['peers_heard']}) · slots {f['reservations']} · circuits {f['circuits']} · "
            f"relayed {f['relayed_bytes'] / 2**20:.2f} MiB · wire in/out {f['bytes_in'] / 2**20:.1f}/"
            f"{f['bytes_out'] / 2**20:.1f} MiB · dial-backs {f['dialbacks']} · RSS {f['rss_mb']:.0f} MB · "
            f"CPU {f['cpu_percent']:.1f}%")


def probe(swarm: str, listen_host: str, port: int, helpers: tuple[str, ...], data_dir: Path,
          timeout_s: float = PROBE_TIMEOUT_S) -> Reachability:
    """The verdict a node would reach now; "unknown" when no helper answered within `timeout_s`.
    Raises SwarmError when the port is taken (a node is running) and ValueError on a bad address."""
    identity = load_or_create(data_dir)
    host = SwarmHost(HostSettings(swarm, PROTOCOL_VERSION, listen_host, port, helpers, named=len(helpers)),
                     identity.key_pair, gossip_validator=lambda origin, data: False,
                     serve_bundle=lambda digest: None, on_fetched=lambda *outcome: None)
    host.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            verdict = host.reachability()
            if verdict.state in ("direct", "relayed", "unreachable"):
                return verdict
            time.sleep(0.5)
        return host.reachability()
    finally:
        host.stop()

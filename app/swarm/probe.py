"""`swarmling doctor`'s reachability check when no node is running: start the swarm host on the
configured port for a few seconds, let a helper dial it back (reachability.py), report, stop.

The port matters (a router forwards one port), so the check uses the node's own; a running node
holds it and answers instead (its verdict is in `swarmling status`)."""

from __future__ import annotations

import time
from pathlib import Path

from .host import HostSettings, SwarmHost
from .identity import load_or_create
from .reachability import Reachability
from .wire import PROTOCOL_VERSION

PROBE_TIMEOUT_S = 30.0  # connect to a helper (≤ 5 s), its dial-back (≤ 5 s), a slot (≤ 10 s)


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

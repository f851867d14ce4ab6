"""A swarm peer for the namespace lab, steered over stdin, answering in JSON lines.

    python tests/lab_peer.py helper HOME PORT            a `swarmling relay` helper (app/swarm/helper.py)
    python tests/lab_peer.py node HOME PORT BOOTSTRAP    a real SwarmNetwork, no model: it shares
                                                         bundles of real task groups on request

Commands (one per line) and the JSON line each answers with, `{"cmd": ..., ...}`:
    state      reachability, announced addresses, peers, fetched bundles, bytes and fetch failures since the start
               (a helper: its relay figures)
    share N    (node) share a bundle of real groups as round N
    fetch      (node) plan fetches of everything announced, as a round does
The first line printed is `{"ready": ..., "peer_id": ..., "addrs": [...]}`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from swarm_peers import SWARM, bundle_and_announcement, real_groups  # noqa: E402

from swarmling.app.swarm.helper import Helper, HelperSettings  # noqa: E402
from swarmling.app.swarm.network import SwarmNetwork, SwarmSettings  # noqa: E402
from swarmling.app.swarm.p2p.identity import load_or_create  # noqa: E402
from swarmling.app.swarm.verification.inbox import Inbox  # noqa: E402
from swarmling.app.swarm.verification.pool import GroupPool  # noqa: E402
from swarmling.app.swarm.verification.wire import digest  # noqa: E402


def ask(proc, cmd: str, timeout: float = 30.0) -> dict:
    """From a test or script: send one command to a lab peer (a netlab LabProcess) and return its
    JSON answer; AssertionError with the peer's output when none comes within `timeout`."""
    from waiting import wait_until

    def answers() -> list[str]:
        return [line for line in list(proc.lines) if line.startswith('{"cmd"')]

    before = len(answers())
    proc.send(cmd)
    wait_until(lambda: len(answers()) > before or proc.popen.poll() is not None, timeout_s=timeout)
    if len(answers()) > before:
        return json.loads(answers()[before])
    raise AssertionError(f"{proc.role}: no answer to {cmd!r}; output:\n" + "\n".join(proc.lines[-30:]))


def say(**fields) -> None:
    # One write per line: stderr shares the pipe, and a log line must not land inside an answer.
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def share(network: SwarmNetwork, groups, round_no: int) -> int:
    """What `SwarmNetwork.share` does with a round's groups, with real task groups and no model."""
    body, ann = bundle_and_announcement(network.peer_id, groups, round_no, addrs=network.host.announce_addrs())
    with network._own_lock:
        network._own[digest(body)] = body
    network.host.publish(ann)
    return len(body)


def dial_author(network: SwarmNetwork, addr: str) -> dict:
    import time

    import trio

    async def go() -> dict:
        started = time.monotonic()
        authors = network.host._bundles._dial_author.__self__  # the host's AuthorDialer (dialer.py)
        why = await authors._dial_one(addr)
        return {"ok": not why, "why": why, "s": round(time.monotonic() - started, 3)}

    return trio.from_thread.run(go, trio_token=network.host._trio._token)


def main(kind: str, home: str, port: int, bootstrap: str = "") -> None:
    identity = load_or_create(Path(home))
    if kind == "helper":
        helper = Helper(HelperSettings(SWARM, "0.0.0.0", port), identity, Path(home))
        helper.start()
        say(ready=True, peer_id=identity.peer_id, addrs=helper.addresses())
        for line in sys.stdin:
            if line.split()[:1] == ["state"]:
                say(cmd="state", **helper.figures())
        helper.stop()
        return
    dial = (bootstrap,) if bootstrap else ()
    network = SwarmNetwork(SwarmSettings(SWARM, "0.0.0.0", port, dial, (), False, 256 * 1024),
                           identity, Inbox(GroupPool()), Path(home), "smollm2-135m")
    network.start()
    groups = real_groups(2)  # before "ready": generating tasks the first time takes seconds on a loaded machine
    say(ready=True, peer_id=identity.peer_id, addrs=network.listen_addrs)
    rng = np.random.default_rng(0)
    totals = {"bytes_in": 0, "bundle_bytes_in": 0, "failures": []}
    for line in sys.stdin:
        cmd, *args = line.split() or [""]
        if cmd == "state":
            reach = network.host.reachability()
            stats = network.round_stats()  # per-round figures: summed here since the start
            totals["bytes_in"] += stats.bytes_in
            totals["bundle_bytes_in"] += stats.bundle_bytes_in
            totals["failures"] += stats.fetch_failures
            say(cmd=cmd, state=reach.state, describe=reach.describe(), announce=network.host.announce_addrs(),
                peers=network.host.connected_peers(), fetched=network._fetched, heard=network.board.peers_heard(),
                announcements=network.board.received,
                **totals)
        elif cmd == "share":
            size = share(network, groups, int(args[0]))
            say(cmd=cmd, size=size)
        elif cmd == "fetch":
            say(cmd=cmd, planned=network.plan_fetches(rng))
        elif cmd == "dial":  # dial ADDR: as a fetch dials an author, reporting seconds or the error
            say(cmd=cmd, **dial_author(network, args[0]))
    network.stop()


if __name__ == "__main__":
    if os.environ.get("LAB_DEBUG"):  # py-libp2p's own account, on stderr (the lab collects it)
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
        for noisy in ("libp2p.pubsub", "multiaddr", "libp2p.host.ping"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    else:  # as `swarmling run` does: py-libp2p logs every departed peer's failure
        logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])

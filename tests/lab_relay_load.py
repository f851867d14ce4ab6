"""What a helper costs with N volunteers behind NATs: `python tests/lab_relay_load.py --nodes 16`.

Needs root (the namespace lab, tests/netlab.py). Starts one helper on the simulated internet and
N network-only nodes (tests/lab_peer.py: the real SwarmNetwork, no model) split over two home
NATs, each told only the helper's address. Every node shares one bundle of real task groups per
round and fetches what it heard, as a node's round does; the helper relays every fetch (every node
is behind NAT). It prints the helper's figures each round (peers, slots, circuits, relayed bytes,
wire bytes, RSS, CPU) and, at the end, the means over the measured rounds. The same figures are
what `swarmling relay` prints and writes to relay.json. A helper gives one address at most
SLOTS_PER_IP slots (app/swarm/nat/relay.py), so two homes hold at most 16 relayed nodes: more are
refused here (a run with 20 left 4 that nobody could fetch from).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
from collections import Counter
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import functools  # noqa: E402

from lab_peer import ask as ask_peer  # noqa: E402
from netlab import netlab  # noqa: E402

from swarmling.app.swarm.nat.relay import SLOTS_PER_IP  # noqa: E402

PEER = str(Path(__file__).with_name("lab_peer.py"))
PORT = 4001
ask = functools.partial(ask_peer, timeout=60.0)  # 21 processes on 2 cores answer slowly


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-s", type=float, default=15.0, help="seconds per round (default 15)")
    args = parser.parse_args()
    if args.nodes > 2 * SLOTS_PER_IP:
        parser.error(f"--nodes {args.nodes}: the lab's two homes hold at most {2 * SLOTS_PER_IP} relayed nodes "
                     f"(a helper gives one address {SLOTS_PER_IP} slots)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the lab's teardown runs (namespaces removed)
    per_home = (args.nodes + 1) // 2
    with tempfile.TemporaryDirectory() as tmp, netlab(hosts_per_home=per_home) as lab:
        home = Path(tmp)
        helper = lab.spawn("pub", [sys.executable, PEER, "helper", str(home / "helper"), str(PORT)],
                           lifetime_s=args.rounds * args.round_s + 600)
        helper_id = json.loads(helper.expect('"ready"', timeout=60))["peer_id"]
        helper_addr = f"/ip4/{lab.addr('pub')}/tcp/{PORT}/p2p/{helper_id}"
        nodes = []
        for role in lab.hosts[: args.nodes]:
            proc = lab.spawn(role, [sys.executable, PEER, "node", str(home / role), str(PORT), helper_addr],
                             lifetime_s=args.rounds * args.round_s + 600)
            nodes.append(proc)
        for proc in nodes:
            proc.expect('"ready"', timeout=120)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and any(ask(p, "state")["state"] != "relayed" for p in nodes):
            time.sleep(2)
        relayed = sum(ask(p, "state")["state"] == "relayed" for p in nodes)
        print(f"{len(nodes)} nodes behind 2 NATs, {relayed} relayed through the helper", flush=True)
        ask(helper, "state")  # starts the CPU measurement window
        rows = []
        for round_no in range(1, args.rounds + 1):
            started = time.monotonic()
            for proc in nodes:
                ask(proc, f"share {round_no}")
            time.sleep(min(3.0, args.round_s / 3))  # announcements spread through the helper
            for proc in nodes:
                ask(proc, "fetch")
            time.sleep(max(0.0, args.round_s - (time.monotonic() - started)))
            figures = ask(helper, "state")
            fetched = sum(ask(p, "state")["fetched"] for p in nodes)
            rows.append({**figures, "fetched": fetched})
            print(f"round {round_no}: peers {figures['peers']} slots {figures['reservations']} circuits "
                  f"{figures['circuits']} relayed {figures['relayed_bytes'] / 1024:.0f} KiB (fetched so far {fetched}) "
                  f"wire in/out {figures['bytes_in'] / 1024:.0f}/{figures['bytes_out'] / 1024:.0f} KiB "
                  f"RSS {figures['rss_mb']:.0f} MB CPU {figures['cpu_percent']:.1f}%", flush=True)
        failures = Counter()
        for proc in nodes:
            for failure in ask(proc, "state")["failures"]:
                failures[failure.split(": ", 1)[-1][:90]] += 1
        print("fetch failures:", dict(failures.most_common(6)) or "none")
        measured = rows[1:] or rows
        per_round_relayed = (rows[-1]["relayed_bytes"] - rows[0]["relayed_bytes"]) / max(1, len(rows) - 1)
        per_round_wire = (rows[-1]["bytes_in"] + rows[-1]["bytes_out"] - rows[0]["bytes_in"] - rows[0]["bytes_out"]) / max(1, len(rows) - 1)
        print(f"\nhelper with {len(nodes)} nodes, rounds 2-{len(rows)} ({args.round_s:.0f} s each): "
              f"RSS {max(r['rss_mb'] for r in measured):.0f} MB max, CPU {statistics.fmean(r['cpu_percent'] for r in measured):.1f}% "
              f"of one core (mean), relayed {per_round_relayed / 1024:.0f} KiB/round, wire in+out "
              f"{per_round_wire / 1024:.0f} KiB/round, fetches {rows[-1]['fetched']} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`swarmling bench-swarm`: what one node's network pays per round as the swarm grows, with no
model: the lab's network-only nodes (swarm_lab.py) at several swarm sizes, and the report.

The model behind the 10,000-node line: per round a node receives its fetched bundles (bounded by
the budget: ≤ 8 bundles, ≤ 256 KiB) plus, for each announcer of its shard, the announcement about
once per mesh peer that forwards it (py-libp2p's mesh takes every connection up to degree_high
12: measured 16 copies at 16 nodes on one topic, 3 in 64 nodes' small shard meshes) with its
envelope and the signed peer record py-libp2p adds to every RPC. The shard count keeps announcers per shard within MERGE_BELOW..SPLIT_ABOVE (12..32; a change
lands at ≤ 24), so that part is bounded whatever the swarm's size: the per-announcement cost
measured at the largest size, times the announcers of one shard, plus the bundles. Figures:
docs/design.md, "Scale: sharded announcements".
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict
from pathlib import Path
from statistics import fmean

from .arguments import Invocation, node_counts, positive
from .swarm_lab import BenchOptions, SwarmResult, round_seconds, run_swarm


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)] if ordered else 0.0


def table(results: list[SwarmResult]) -> list[str]:
    lines = [f"{'nodes':>5}  {'in KiB/node/round':>17}  {'p90':>6}  {'bundles KiB':>11}  {'gossip KiB':>10}  "
             f"{'heard/node/round':>16}  {'min':>4}  {'fetches':>7}  {'shards':>7}  {'peers':>5}"]
    for res in results:
        kib = [b / 1024 for b in res.column("bytes_in")]
        bundles = [b / 1024 for b in res.column("bundle_bytes_in")]
        heard = res.column("announcements")
        shards = sorted(set(res.shards_at_end))
        lines.append(f"{res.nodes:>5}  {fmean(kib):>17.1f}  {_p90(kib):>6.1f}  {fmean(bundles):>11.1f}  "
                     f"{fmean(kib) - fmean(bundles):>10.1f}  {fmean(heard):>16.1f}  {min(heard):>4.0f}  "
                     f"{fmean(res.column('fetches')):>7.2f}  {'/'.join(map(str, shards)):>7}  "
                     f"{fmean(res.column('peers')):>5.1f}")
    return lines


def breakdown(results: list[SwarmResult]) -> list[str]:
    """Where a node's inbound KiB go, per round (measured rounds' means)."""
    keys = ("data", "envelope", "peer record", "control", "subscriptions")
    lines = [f"{'nodes':>5}  {'bundles':>7}  " + "  ".join(f"{k:>13}" for k in keys)
             + f"  {'other':>6}  {'messages in':>11}"]
    for res in results:
        if not res.pubsub:
            continue
        part = {k: fmean(p.get(k, 0) for p in res.pubsub) / 1024 for k in (*keys, "rpc", "messages")}
        total, bundles = fmean(res.column("bytes_in")) / 1024, fmean(res.column("bundle_bytes_in")) / 1024
        other = total - bundles - part["rpc"]
        lines.append(f"{res.nodes:>5}  {bundles:>7.1f}  " + "  ".join(f"{part[k]:>13.1f}" for k in keys)
                     + f"  {other:>6.1f}  {part['messages'] * 1024:>11.1f}")
    return lines


def projection(results: list[SwarmResult], nodes: int = 10_000) -> str:
    """The measured cost of one heard announcement (gossip KiB / heard), carried to `nodes`."""
    from ..swarm.verification.shards import landing_level

    sharded = [r for r in results if fmean(r.column("announcements")) > 0]
    if not sharded:
        return ""
    big = max(sharded, key=lambda r: r.nodes)
    kib, bundles, heard = (fmean(big.column(k)) for k in ("bytes_in", "bundle_bytes_in", "announcements"))
    per_announcement = (kib - bundles) / 1024 / heard
    level = landing_level(nodes)
    per_shard = nodes / (1 << level)
    worst = 32
    return (f"projection to {nodes:,} nodes (measured at {big.nodes}: {per_announcement:.2f} KiB of gossip per heard "
            f"announcement, {bundles / 1024:.0f} KiB of bundles): {1 << level} shards of ≈{per_shard:.0f}, "
            f"≈{bundles / 1024 + (per_shard - 1) * per_announcement:.0f} KiB/node/round "
            f"(at most ≈{bundles / 1024 + (worst - 1) * per_announcement:.0f} with {worst} per shard, the band's top)")


def bench_swarm(opts: BenchOptions, say=print) -> int:
    base = opts.directory or Path(tempfile.mkdtemp(prefix="swarmling-bench-swarm-"))
    results = []
    for n in opts.counts:
        say(f"{n} network-only nodes on 127.0.0.1 ({opts.warmup} warm-up + {opts.rounds} measured rounds of "
            f"{round_seconds(n, opts):.0f} s, each dialling {min(opts.dial, n - 1)} random others)")
        results.append(run_swarm(n, opts, base / f"{n}-nodes", say))
    say("\nper node per round, measured rounds (wire bytes after Noise/yamux; gossip = all but bundle payload)")
    for line in table(results):
        say(line)
    say("\nwhere it goes, KiB/node/round (pubsub frames by part; other = Noise, yamux, identify, dials, fetch requests)")
    for line in breakdown(results):
        say(line)
    means = {r.nodes: fmean(r.column("bytes_in")) for r in results}
    if 16 in means and len(means) > 1:
        top = max(means)
        say(f"inbound per node, {top} vs 16 nodes: ×{means[top] / means[16]:.2f} (issue 14 asks ≤ 1.5×)")
    line = projection(results)
    if line:
        say(line)
    summary = base / "bench-swarm.json"
    summary.write_text(json.dumps({"options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
                                   "results": [asdict(r) for r in results]}, indent=1))
    say(f"per-node samples: {summary}")
    return 0


def bench_swarm_arguments(p) -> None:
    p.add_argument("--nodes", type=node_counts, default=(8, 16, 32, 64), metavar="N[,N…]",
                   help="swarm sizes, one after the other (default 8,16,32,64)")
    p.add_argument("--rounds", type=positive, default=3, help="measured rounds per size (default 3)")
    p.add_argument("--warmup", type=int, help="rounds before measuring (default 3; 7 with --cold)")
    p.add_argument("--round-seconds", type=float, default=0.0,
                   help="length of a round (default: 15 s, or 0.9 s per node when more)")
    p.add_argument("--cold", action="store_true",
                   help="start every node on one topic (shard levels then settle within 7 rounds)")
    p.add_argument("--dial", type=positive, default=4, help="random peers each node dials (default 4)")
    p.add_argument("--dir", type=Path, help="where the nodes keep identities and the results (default: a temp folder)")


def bench_swarm_main(c: Invocation) -> int:
    a = c.args
    warmup = a.warmup if a.warmup is not None else 7 if a.cold else 3
    return bench_swarm(BenchOptions(a.nodes, rounds=a.rounds, warmup=warmup, round_s=a.round_seconds, dial=a.dial,
                                    directory=a.dir, cold=a.cold))
